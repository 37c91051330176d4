"""The classes of damaged input of scripts/data/fuzz_inputs.py, one module a family."""
