#!/usr/bin/env python3
"""The slot bookkeeping of scripts/adgt-elastic, without launching anything.

A hostfile of three hosts: a failure named on a host drops one slot
(--on-failure slot) or the whole host (--on-failure host, srun); a rewritten
hostfile is the truth again (hosts come back); `take` fills hosts in the
launcher's order; the run's --resume is replaced; the verdict file of the
newest failure is the one read; srun's command names the nodes it uses.
"""
import importlib.machinery
import importlib.util
import os
import sys
import tempfile
import time
import types
import unittest

sys.dont_write_bytecode = True  # no __pycache__ beside the script
HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.path.join(HERE, "..", "..", "scripts", "adgt-elastic")
loader = importlib.machinery.SourceFileLoader("adgt_elastic", PATH)
spec = importlib.util.spec_from_loader("adgt_elastic", loader)
el = importlib.util.module_from_spec(spec)
loader.exec_module(el)


def write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


class SlotsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.hosts = os.path.join(self.dir, "hosts")
        write(self.hosts, "# three nodes\nnode1 slots=4\nnode2 slots=4 max_slots=8\nnode3\n")

    def args(self, **kw):
        d = dict(hostfile=self.hosts, launcher="mpirun", np=0, launcher_args="", plan="auto")
        d.update(kw)
        return types.SimpleNamespace(**d)

    def test_read(self):
        self.assertEqual(el.read_hostfile(self.hosts), [("node1", 4), ("node2", 4), ("node3", 1)])
        write(self.hosts, "node1 slots=x\n")
        with self.assertRaises(SystemExit) as e:
            el.read_hostfile(self.hosts)
        self.assertIn("hosts:1", str(e.exception))

    def test_drop_slot_and_host(self):
        s = el.Slots(self.args())
        self.assertEqual(sum(k for _, k in s.available()), 9)
        s.drop("node2", whole=False)
        s.drop("node2", whole=False)
        self.assertEqual(s.available(), [("node1", 4), ("node2", 2), ("node3", 1)])
        s.drop("node1", whole=True)
        self.assertEqual(s.available(), [("node2", 2), ("node3", 1)])
        self.assertEqual(el.take(s.available(), 2), [("node2", 2)])
        self.assertEqual(el.take(s.available(), 3), [("node2", 2), ("node3", 1)])

    def test_hostfile_change_brings_hosts_back(self):
        s = el.Slots(self.args())
        s.drop("node1", whole=True)
        self.assertFalse(s.changed())
        time.sleep(0.01)
        write(self.hosts, "node1 slots=4\nnode2 slots=4\nnode3\nnode4 slots=2\n")
        self.assertTrue(s.changed())
        s.refresh()
        self.assertFalse(s.changed())
        self.assertEqual(sum(k for _, k in s.available()), 11)

    def test_single_host(self):
        s = el.Slots(self.args(hostfile="", np=4))
        s.drop(os.uname().nodename, whole=False)  # the verdict names the real host name
        self.assertEqual(s.available(), [("localhost", 3)])

    def test_commands(self):
        a = self.args(launcher_args="--oversubscribe")
        cmd = el.launch_cmd(a, [("node1", 4), ("node2", 2)], 6, "adgt-train",
                            ["--config", "r.yaml", "--resume", "step_5", "--set", "x=1"])
        self.assertEqual(cmd[:6], ["mpirun", "-np", "6", "--host", "node1:4,node2:2", "--oversubscribe"])
        self.assertEqual(cmd[6:], ["adgt-train", "--config", "r.yaml", "--set", "x=1", "--resume", "auto",
                                   "--set", "parallel.auto=true"])
        cmd = el.launch_cmd(self.args(launcher="srun", plan="keep"), [("n1", 8), ("n3", 8)], 16, "t", [])
        self.assertIn("--nodelist=n1,n3", cmd)
        self.assertIn("--ntasks=16", cmd)
        self.assertNotIn("parallel.auto=true", cmd)

    def test_verdict(self):
        hb = os.path.join(self.dir, ".heartbeat")
        os.makedirs(hb)
        write(os.path.join(hb, "verdict.old"), "token old\nculprit_launcher 1\nculprit_host a\n")
        os.utime(os.path.join(hb, "verdict.old"), (1, 1))
        t0 = time.time() - 1
        self.assertIsNone(el.verdict_since(self.dir, t0))
        write(os.path.join(hb, "verdict.new"),
              "token new\nby 2\nculprit 3\nculprit_launcher 3\nculprit_host node2\ncause dead\nmessage rank 3 died\n")
        v = el.verdict_since(self.dir, t0)
        self.assertEqual((v["culprit_launcher"], v["culprit_host"], v["cause"]), ("3", "node2", "dead"))
        write(os.path.join(hb, "rank0.hb"), "token new\nstep 17\nend\n")
        write(os.path.join(hb, "rank1.hb"), "token new\nstep 18\nend\n")
        self.assertEqual(el.steps_done(self.dir, t0), 18)


if __name__ == "__main__":
    unittest.main(verbosity=2)
