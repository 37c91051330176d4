# Checkpoint format checked by an independent reader: h5py reads what
# save_checkpoint wrote (values, shapes, zlib crc32s, meta), and
# load_checkpoint reads a checkpoint that h5py wrote from scratch.
add_executable(adgt_checkpoint_fixture ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint_fixture.cpp)
target_link_libraries(adgt_checkpoint_fixture PRIVATE adgt_core)
add_test(NAME checkpoint_h5py
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint_h5py_check.py
          --fixture $<TARGET_FILE:adgt_checkpoint_fixture>
          --workdir ${CMAKE_CURRENT_BINARY_DIR}/checkpoint_h5py)
set_tests_properties(checkpoint_h5py PROPERTIES LABELS checkpoint ENVIRONMENT OMP_NUM_THREADS=2)
