# Gradient compression (docs/compression.md). Unit tests of the codecs are
# tests/unit/compress_codec_test.cpp. Here: the compressed reduce of a bucket
# on 4 MPI ranks (exact sums, identical results, ZeRO-1 chunks, bytes), and
# training on 4 CPU ranks of the byte-level KJV corpus
# (tests/compress/compress_train.py): off unchanged, every level trains with
# bit-identical dp replicas, a resume restores the error feedback bit for bit,
# and the layouts tp=2 dp=2, pp=2 dp=2, ZeRO-1 and cp=2 dp=2.
if(NOT TARGET adgt_parallel)
  return()
endif()
set(ADGT_GC ${CMAKE_CURRENT_SOURCE_DIR}/compress)
add_executable(adgt_compress_reduce_test ${ADGT_GC}/compress_reduce_test.cpp)
target_link_libraries(adgt_compress_reduce_test PRIVATE adgt_parallel)
add_test(NAME compress_reduce_np4
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh --success "^compress reduce: ok on 4 ranks" --
          timeout 60 ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh 4 $<TARGET_FILE:adgt_compress_reduce_test>)
set_tests_properties(compress_reduce_np4 PROPERTIES LABELS "parallel;compress" TIMEOUT 90 PROCESSORS 2)

if(NOT TARGET adgt-train)
  return()
endif()
set(ADGT_GC_ARGS ${ADGT_PYTHON} ${ADGT_GC}/compress_train.py --train $<TARGET_FILE:adgt-train>
  --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh --data ${CMAKE_BINARY_DIR}/data/kjv-byte
  --model ${ADGT_GC}/model.yaml)
set(ADGT_GC_TESTS compress_train_off_unchanged)
add_test(NAME compress_train_off_unchanged
  COMMAND ${ADGT_GC_ARGS} --work ${CMAKE_BINARY_DIR}/compress/off --case off)
foreach(level bf16 int8 int4 int3 int2 powersgd)
  add_test(NAME compress_train_${level}
    COMMAND ${ADGT_GC_ARGS} --work ${CMAKE_BINARY_DIR}/compress/${level} --case train --level ${level})
  list(APPEND ADGT_GC_TESTS compress_train_${level})
endforeach()
foreach(level int8 int3 int2 powersgd)
  add_test(NAME compress_resume_${level}
    COMMAND ${ADGT_GC_ARGS} --work ${CMAKE_BINARY_DIR}/compress/resume_${level} --case resume --level ${level})
  list(APPEND ADGT_GC_TESTS compress_resume_${level})
endforeach()
# Layouts: each dp group compresses on its own.
foreach(case "tp2_dp2;tp=2,dp=2;int8" "pp2_dp2;pp=2,dp=2;int4" "zero1;dp=4,zero=1;int8"
             "zero1_powersgd;dp=4,zero=1;powersgd" "cp2_dp2;cp=2,dp=2;int8"
             "cp2_dp2_powersgd;cp=2,dp=2;powersgd")
  list(GET case 0 name)
  list(GET case 1 layout)
  list(GET case 2 level)
  add_test(NAME compress_train_${name}
    COMMAND ${ADGT_GC_ARGS} --work ${CMAKE_BINARY_DIR}/compress/${name} --case train --level ${level}
            --layout ${layout})
  list(APPEND ADGT_GC_TESTS compress_train_${name})
endforeach()
# Context parallelism: the buckets reduce over dp x cp; a resume restores
# the error feedback there bit for bit.
add_test(NAME compress_resume_cp2_dp2
  COMMAND ${ADGT_GC_ARGS} --work ${CMAKE_BINARY_DIR}/compress/resume_cp2_dp2 --case resume --level int8
          --layout cp=2,dp=2)
list(APPEND ADGT_GC_TESTS compress_resume_cp2_dp2)
set_tests_properties(${ADGT_GC_TESTS} PROPERTIES
  FIXTURES_REQUIRED kjv_byte LABELS "parallel;compress" TIMEOUT 120 PROCESSORS 2)

# The controller of grad_compression auto (tests/compress/controller_train.py):
# under a 50 Mbit/s emulated link it compresses, under 100 Gbit/s it stays at
# off or bf16; every rank applies rank 0's logged decision; replicas identical.
# On the emulation's model clock (compute, probes and codec costs counted):
# the same decisions on any machine under any load.
# schedule: fast -> 50 Mbit/s -> fast in one run (emulate.link_bandwidth), the
# levels following each change within 2 controller intervals.
# sites: two sites joined by a 50 Mbit/s WAN, fast inside, the dp group reduced
# over the sites: the cross-site exchange priced apart from the sites' links.
foreach(link slow fast schedule sites)
  add_test(NAME compress_controller_${link}_np4
    COMMAND ${ADGT_PYTHON} ${ADGT_GC}/controller_train.py --train $<TARGET_FILE:adgt-train>
            --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh --data ${CMAKE_BINARY_DIR}/data/kjv-byte
            --model ${ADGT_GC}/model.yaml --work ${CMAKE_BINARY_DIR}/compress/controller_${link} --link ${link})
  set_tests_properties(compress_controller_${link}_np4 PROPERTIES
    FIXTURES_REQUIRED kjv_byte LABELS "parallel;compress" TIMEOUT 120 PROCESSORS 2)
endforeach()
