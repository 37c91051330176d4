# Every data/tensor-parallel layout against the single process (8 CPU ranks at
# most, mpirun --oversubscribe), on byte-level shards of the default corpus.
if(NOT TARGET adgt-train OR NOT TARGET adgt-data OR NOT TARGET adgt_parallel)
  return()
endif()
set(ADGT_KJV_BYTE ${CMAKE_BINARY_DIR}/data/kjv-byte)
add_test(NAME layouts_prepare_bytes
  COMMAND ${CMAKE_COMMAND} -E env ADGT_TOKENIZER=byte
    ${CMAKE_SOURCE_DIR}/scripts/prepare_data.sh ${ADGT_KJV_BYTE} $<TARGET_FILE:adgt-data>)
set_tests_properties(layouts_prepare_bytes PROPERTIES FIXTURES_SETUP kjv_byte)
# Also on the emulated device (train.device: emulated, docs/parallel.md): the
# code paths of the CUDA backend, device memory the host cannot touch, every
# collective staged through host memory.
set(ADGT_SWEEP_ARGS --train $<TARGET_FILE:adgt-train>
  --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh --data ${ADGT_KJV_BYTE})
adgt_sweep_on_devices(NAME layouts_match_single_process WORK ${CMAKE_BINARY_DIR}/layouts
  TIMEOUT 1500 LABELS parallel
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/layouts/compare_layouts.py ${ADGT_SWEEP_ARGS})
adgt_sweep_on_devices(NAME layouts_bf16_match_single_process WORK ${CMAKE_BINARY_DIR}/layouts_bf16
  TIMEOUT 600 LABELS parallel
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/layouts/compare_bf16.py ${ADGT_SWEEP_ARGS})
# Document masking and per-document positions in layouts that split them
# (tp with SP, interleaved pp's middle chunks, ZeRO-1) against one process.
adgt_sweep_on_devices(NAME layouts_document_mask WORK ${CMAKE_BINARY_DIR}/layouts_documents
  TIMEOUT 600 LABELS parallel
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/layouts/compare_documents.py ${ADGT_SWEEP_ARGS}
    --config ${CMAKE_CURRENT_SOURCE_DIR}/layouts/model.yaml)
set(ADGT_DOC_ARGS --config ${CMAKE_CURRENT_SOURCE_DIR}/layouts/model.yaml
  --set data.train=${ADGT_KJV_BYTE}/train.bin --set data.val=${ADGT_KJV_BYTE}/val.bin
  --set train.steps=5 --set log.dir=${CMAKE_BINARY_DIR}/layouts_documents_err
  --set checkpoint.dir=${CMAKE_BINARY_DIR}/layouts_documents_err/ckpt)
add_test(NAME layouts_document_mask_needs_eos_np2
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/parallel/expect_all_ranks.sh --once 2
    ".*train[.]document_mask / model[.]rope_reset_per_document need the end-of-document token: set data[.]eos_id [(]no meta[.]json with documents[.]eos_id beside data[.]train, and data[.]tokenizer byte has no EOS token[)]"
    -- ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh 2 $<TARGET_FILE:adgt-train> ${ADGT_DOC_ARGS}
       --set parallel.dp=2 --set train.document_mask=true)
add_test(NAME layouts_document_eos_outside_vocabulary
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh
    "end-of-document token 300 [(]from data[.]eos_id[)] is outside the model's vocabulary [[]0, 256[)]"
    -- $<TARGET_FILE:adgt-train> ${ADGT_DOC_ARGS} --set model.rope_reset_per_document=true
       --set data.eos_id=300)
set_tests_properties(layouts_document_mask_needs_eos_np2 layouts_document_eos_outside_vocabulary
  PROPERTIES FIXTURES_REQUIRED kjv_byte LABELS parallel TIMEOUT 90)

# Context parallelism (docs/context-parallel.md): cp2, cp4, tp2 x cp2 (with
# and without SP), cp2 x dp2 with ZeRO-1, cp2 x pp2 (1f1b, zb-h1) and the
# all-to-all mode (cp2, cp4, tp2 x cp2) against the single process (f32:
# 1e-5), a cp2 checkpoint resumed into cp1 and cp4; in f64 cp2 and cp4 within
# 1e-12 (cpu only).
adgt_sweep_on_devices(NAME layouts_cp_match_single_process WORK ${CMAKE_BINARY_DIR}/layouts_cp
  TIMEOUT 600 LABELS parallel DEVICES cpu
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/layouts/compare_cp.py ${ADGT_SWEEP_ARGS})
# On the emulated device the ring's device paths (its sends staged through
# host memory, the block ops' device buffers) with and without ZeRO-1, the
# all-to-all mode's (gathers by index on the device, all-to-alls staged), and
# the resumes into cp1 and cp4; tp and pp with cp are the cpu run's.
adgt_sweep_on_devices(NAME layouts_cp_match_single_process WORK ${CMAKE_BINARY_DIR}/layouts_cp
  TIMEOUT 600 LABELS parallel DEVICES emulated
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/layouts/compare_cp.py ${ADGT_SWEEP_ARGS}
    --cases cp2 cp2_dp2_zero1 cp2_a2a)
adgt_sweep_on_devices(NAME layouts_cp_f64 WORK ${CMAKE_BINARY_DIR}/layouts_cp_f64
  TIMEOUT 600 LABELS parallel DEVICES cpu
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/layouts/compare_cp.py ${ADGT_SWEEP_ARGS}
    --dtype f64 --cases cp2 cp4 --no-resume)
# What context parallelism does not run yet is refused before the launch, by name.
set(ADGT_CP_ARGS --config ${CMAKE_CURRENT_SOURCE_DIR}/layouts/model.yaml
  --set data.train=${ADGT_KJV_BYTE}/train.bin --set data.val=${ADGT_KJV_BYTE}/val.bin
  --set train.steps=5 --set log.dir=${CMAKE_BINARY_DIR}/layouts_cp_err
  --set checkpoint.dir=${CMAKE_BINARY_DIR}/layouts_cp_err/ckpt)
foreach(case
    "all_to_all_heads;2;--set parallel.cp_mode=all-to-all --set model.n_kv_heads=1 --set model.n_heads=2;parallel[.]cp_mode=all-to-all scatters the attention heads over the cp ranks: it needs model[.]n_heads / tp = 2 and model[.]n_kv_heads / tp = 1 divisible by parallel[.]cp=2; use cp in [{]1[}] or cp_mode: ring"
    "seq_len;2;--set model.seq_len=30;parallel[.]cp=2 needs model[.]seq_len=30 divisible by 2 x cp = 4 [(]each rank holds two of 2 x cp equal chunks of a sequence[)]; use cp in [{]1,3,5,15[}]"
    "world;3;;parallel[.]tp=1 x cp=2 x pp=1 x dp=1 = 2 ranks, but the launch has 3")
  list(GET case 0 _name)
  list(GET case 1 _np)
  list(GET case 2 _extra)
  list(GET case 3 _pattern)
  separate_arguments(_extra)
  add_test(NAME layouts_cp_refused_${_name}
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/parallel/expect_all_ranks.sh --once ${_np} ".*${_pattern}.*"
      -- ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh ${_np} $<TARGET_FILE:adgt-train> ${ADGT_CP_ARGS}
         --set parallel.cp=2 ${_extra})
  set_tests_properties(layouts_cp_refused_${_name} PROPERTIES FIXTURES_REQUIRED kjv_byte LABELS parallel
    TIMEOUT 90)
endforeach()

# The same run through srun on a real (private, single-node) Slurm cluster gives
# the mpirun losses bit for bit.
add_test(NAME layouts_srun_matches_mpirun
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/slurm/with_slurm.sh --
    ${CMAKE_CURRENT_SOURCE_DIR}/layouts/srun_vs_mpirun.sh $<TARGET_FILE:adgt-train>
    ${ADGT_KJV_BYTE} ${CMAKE_BINARY_DIR}/layouts_srun)
set_tests_properties(layouts_srun_matches_mpirun PROPERTIES
  FIXTURES_REQUIRED kjv_byte LABELS "parallel;slurm" TIMEOUT 300 RUN_SERIAL TRUE)

# Bad launches of adgt-train itself: the cause reported once for the job, exit 2 on every rank, no hang.
add_test(NAME layouts_error_world_size
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/parallel/expect_all_ranks.sh --once 3
    ".*tiny[.]yaml, --set parallel[.]dp=2, --set parallel[.]tp=2, --set train[.]global_batch=16: parallel[.]tp=2 x pp=1 x dp=2 = 4 ranks, but the launch has 3 [(]mpirun -np / srun -n[)]; use parallel[.]tp=1 parallel[.]pp=1 parallel[.]dp=3 and train[.]global_batch=24 [(]a multiple of micro_batch x dp[)]$"
    -- ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh 3 $<TARGET_FILE:adgt-train>
       --config ${CMAKE_SOURCE_DIR}/configs/tiny.yaml --set parallel.tp=2 --set parallel.dp=2
       --set train.global_batch=16)
add_test(NAME layouts_error_missing_shard_np2
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/parallel/expect_all_ranks.sh --once 2
    ".*tiny[.]yaml, --set data[.]train=/nonexistent/train[.]bin: data[.]train: token shard '/nonexistent/train[.]bin' does not exist"
    -- ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh 2 $<TARGET_FILE:adgt-train>
       --config ${CMAKE_SOURCE_DIR}/configs/tiny.yaml --set parallel.dp=2
       --set train.global_batch=16 --set data.train=/nonexistent/train.bin)
add_test(NAME layouts_error_unknown_launcher
  COMMAND ${CMAKE_COMMAND} -E env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0
    ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh "unknown launcher"
    -- $<TARGET_FILE:adgt-train> --config ${CMAKE_SOURCE_DIR}/configs/tiny.yaml)
set_tests_properties(layouts_error_world_size layouts_error_missing_shard_np2
  layouts_error_unknown_launcher PROPERTIES LABELS parallel TIMEOUT 90)

# A stop signal to any rank, or SIGUSR1 to mpirun (Open MPI forwards SIGUSR1 and
# SIGUSR2 to every rank; SIGTERM to mpirun makes mpirun itself tear the job
# down, so send SIGTERM to the ranks or SIGUSR1 to mpirun): every rank saves at
# the same step, exit 0, and the checkpoint resumes.
foreach(case "TERM;rank" "USR1;mpirun" "USR1;rank")
  list(GET case 0 sig)
  list(GET case 1 to)
  add_test(NAME layouts_signal_${sig}_to_${to}
    COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/parallel/signal_mpirun.py
      --train $<TARGET_FILE:adgt-train> --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
      --data ${ADGT_KJV_BYTE} --work ${CMAKE_BINARY_DIR}/signals --signal ${sig} --to ${to})
  set_tests_properties(layouts_signal_${sig}_to_${to} PROPERTIES
    FIXTURES_REQUIRED kjv_byte LABELS parallel TIMEOUT 300)
endforeach()

# Open MPI's session files: each launch in a base of its own (a single
# process: MpiEnv; a 2-rank launch: tests/parallel/mpirun.sh), nothing left
# behind, the variable not inherited (docs/testing.md).
add_test(NAME layouts_session_dir_per_launch
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/parallel/session_dir_check.py
    --train $<TARGET_FILE:adgt-train> --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
    --data ${ADGT_KJV_BYTE} --work ${CMAKE_BINARY_DIR}/session_dir)
set_tests_properties(layouts_session_dir_per_launch PROPERTIES
  FIXTURES_REQUIRED kjv_byte LABELS parallel TIMEOUT 300)

# bf16 mixed precision under pp (bitwise), dp, ZeRO-1, tp and SP against the
# single bf16 process (tests/layouts/compare_bf16.py; ~20 s).
# (layouts_bf16_match_single_process[_emulated] are made with the layout sweep above.)

# The emulated device catches host code that touches device memory: with the
# fault injection ADGT_TEST_HOST_READ=1 the trainer reads a weight through its
# raw pointer after step 1; on the emulated device that read faults with a
# report naming the buffer (every rank stops, non-zero), on the CPU it is
# harmless and the run ends normally.
add_test(NAME emulated_catches_host_read_np1
  COMMAND ${CMAKE_COMMAND} -E env ADGT_TEST_HOST_READ=1 OMP_NUM_THREADS=1
    ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh "host code read or wrote emulated device memory at .*[(]byte 0 of a" --
    $<TARGET_FILE:adgt-train> --config ${CMAKE_CURRENT_SOURCE_DIR}/layouts/model.yaml
    --set train.device=emulated --set train.steps=2 --set train.warmup_steps=1
    --set data.train=${ADGT_KJV_BYTE}/train.bin --set data.val=${ADGT_KJV_BYTE}/val.bin
    --set log.dir=${CMAKE_BINARY_DIR}/emulated_host_read/np1 --set checkpoint.interval=0
    --set checkpoint.dir=${CMAKE_BINARY_DIR}/emulated_host_read/np1/ckpt)
add_test(NAME emulated_catches_host_read_np2
  COMMAND ${CMAKE_COMMAND} -E env ADGT_TEST_HOST_READ=1
    ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh "rank [01]: host code read or wrote emulated device memory" --
    timeout 120 ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh 2 $<TARGET_FILE:adgt-train>
    --config ${CMAKE_CURRENT_SOURCE_DIR}/layouts/model.yaml
    --set train.device=emulated --set train.steps=2 --set train.warmup_steps=1 --set parallel.dp=2
    --set data.train=${ADGT_KJV_BYTE}/train.bin --set data.val=${ADGT_KJV_BYTE}/val.bin
    --set log.dir=${CMAKE_BINARY_DIR}/emulated_host_read/np2 --set checkpoint.interval=0
    --set checkpoint.dir=${CMAKE_BINARY_DIR}/emulated_host_read/np2/ckpt)
add_test(NAME emulated_host_read_harmless_on_cpu
  COMMAND ${CMAKE_COMMAND} -E env ADGT_TEST_HOST_READ=1 OMP_NUM_THREADS=1
    ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh --success "ADGT_TEST_HOST_READ: read the first weight" --
    $<TARGET_FILE:adgt-train> --config ${CMAKE_CURRENT_SOURCE_DIR}/layouts/model.yaml
    --set train.device=cpu --set train.steps=2 --set train.warmup_steps=1
    --set data.train=${ADGT_KJV_BYTE}/train.bin --set data.val=${ADGT_KJV_BYTE}/val.bin
    --set log.dir=${CMAKE_BINARY_DIR}/emulated_host_read/cpu --set checkpoint.interval=0
    --set checkpoint.dir=${CMAKE_BINARY_DIR}/emulated_host_read/cpu/ckpt)
set_tests_properties(emulated_catches_host_read_np1 emulated_catches_host_read_np2
  emulated_host_read_harmless_on_cpu PROPERTIES FIXTURES_REQUIRED kjv_byte LABELS "parallel" TIMEOUT 150)

# Activation recompute (train.recompute selective / full / full for one layer
# per stage) gives the losses and weights of keeping everything, bit for bit,
# single-process, tp+SP, pp (1f1b with dp, zb-h1's split backward) and MoE
# with ep; --dry-run's activation memory falls. Also on the emulated device,
# there without "full for one layer per stage" (a mix of the full and the
# kept layers' paths, which the other two modes take on that device; the cpu
# run has all three).
adgt_sweep_on_devices(NAME recompute_bitwise WORK ${CMAKE_BINARY_DIR}/recompute
  TIMEOUT 600 LABELS parallel DEVICES cpu
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/layouts/compare_recompute.py ${ADGT_SWEEP_ARGS})
adgt_sweep_on_devices(NAME recompute_bitwise WORK ${CMAKE_BINARY_DIR}/recompute
  TIMEOUT 600 LABELS parallel DEVICES emulated
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/layouts/compare_recompute.py ${ADGT_SWEEP_ARGS}
    --modes selective full)

# A step waits for the device twice (its losses, the gradient norm), whatever
# the micro-batches and tensors (the emulated device counts the waits).
add_test(NAME emulated_host_reads_per_step
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/layouts/host_reads_check.py
    --train $<TARGET_FILE:adgt-train> --data ${ADGT_KJV_BYTE} --work ${CMAKE_BINARY_DIR}/host_reads)
set_tests_properties(emulated_host_reads_per_step PROPERTIES
  FIXTURES_REQUIRED kjv_byte LABELS "parallel" TIMEOUT 120)
