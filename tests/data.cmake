# End-to-end checks of adgt-data on a small generated text (docs/data-format.md).
if(NOT TARGET adgt-data)
  return()
endif()

# ~60 KB of deterministic pseudo-text: lines of words from a small vocabulary,
# a blank line every 8 lines.
set(_words the and of to in that shall unto he lord his they be is him not them it with all
           thou thy was which my for me but ye i are said upon this have)
list(LENGTH _words _nwords)
set(_text "")
set(_state 12345)
foreach(line RANGE 1 1000)
  set(_line "")
  foreach(w RANGE 1 9)
    math(EXPR _state "(${_state} * 1103515245 + 12345) % 2147483648")
    math(EXPR _i "(${_state} / 65536) % ${_nwords}")
    list(GET _words ${_i} _word)
    string(APPEND _line "${_word} ")
  endforeach()
  string(APPEND _text "  ${line} ${_line}\n")
  math(EXPR _para "${line} % 8")
  if(_para EQUAL 0)
    string(APPEND _text "\n")
  endif()
endforeach()
set(ADGT_DATA_E2E ${CMAKE_BINARY_DIR}/tests/data_e2e)
file(WRITE ${ADGT_DATA_E2E}/input.txt "${_text}")

set(_data $<TARGET_FILE:adgt-data>)

add_test(NAME data_prepare_bpe
  COMMAND ${_data} prepare --input ${ADGT_DATA_E2E}/input.txt --out ${ADGT_DATA_E2E}/bpe
          --vocab-size 320 --val-fraction 0.1)
set_tests_properties(data_prepare_bpe PROPERTIES FIXTURES_SETUP data_bpe
  PASS_REGULAR_EXPRESSION "train +.*train.bin: [1-9][0-9]* tokens")

add_test(NAME data_info_bpe COMMAND ${_data} info --shard ${ADGT_DATA_E2E}/bpe/val.bin --head 4)
set_tests_properties(data_info_bpe PROPERTIES FIXTURES_REQUIRED data_bpe
  PASS_REGULAR_EXPRESSION "val.bin: [1-9][0-9]* tokens, vocab 320, dtype uint16")

# Reusing the trained model on the same text gives the same shards.
add_test(NAME data_prepare_reuse_model
  COMMAND sh -c "\"$1\" prepare --input \"$2/input.txt\" --out \"$2/reuse\" --tokenizer \"$2/bpe/tokenizer.model\" --val-fraction 0.1 && cmp \"$2/bpe/train.bin\" \"$2/reuse/train.bin\" && cmp \"$2/bpe/val.bin\" \"$2/reuse/val.bin\""
          sh ${_data} ${ADGT_DATA_E2E})
set_tests_properties(data_prepare_reuse_model PROPERTIES FIXTURES_REQUIRED data_bpe)

add_test(NAME data_prepare_byte
  COMMAND ${_data} prepare --input ${ADGT_DATA_E2E}/input.txt --out ${ADGT_DATA_E2E}/byte
          --tokenizer byte)
set_tests_properties(data_prepare_byte PROPERTIES
  PASS_REGULAR_EXPRESSION "tokenizer +byte \\(byte\\), vocab 256")

add_test(NAME data_encode_decode_byte
  COMMAND sh -c "\"$1\" encode --tokenizer byte --text 'hi!' | grep -x '104 105 33' && \"$1\" decode --tokenizer byte --ids '104 105 33' | grep -x 'hi!'"
          sh ${_data})

# Several inputs (a directory of JSON lines, gzip, a file of no known
# format, bad records): the shards equal those of one text file holding the
# same documents; every bad record named (docs/data-format.md, "Inputs").
add_test(NAME data_prepare_inputs
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/data/prepare_inputs.py --data ${_data}
          --text ${ADGT_DATA_E2E}/input.txt --work ${ADGT_DATA_E2E}/inputs)

# Streaming (docs/data-format.md, "Streaming and --resume"): --workers 1,
# --workers 2 in batches of 3 documents and a run stopped after 2 of 5 files
# then --resume'd write the same bytes, equal to the fixture made by the
# whole-corpus encoding from before streaming; one test per tokenizer case.
foreach(case byte json_bos bpe last_to_val)
  add_test(NAME data_prepare_stream_${case}
    COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/data/prepare_stream.py --data ${_data} --case ${case}
            --work ${ADGT_DATA_E2E}/stream_${case})
endforeach()

# Parquet inputs (pyarrow writes the fixtures; docs/data-format.md, "Inputs"):
# the shards equal those of the same documents as JSON lines; nulls, a
# damaged row group and a file that is not Parquet are named bad records.
# A build without Arrow (scripts/install_deps.sh not run) refuses them by
# name instead, and says how to enable them.
set(_pq ${ADGT_DATA_E2E}/parquet)
if(ADGT_HAVE_PARQUET)
  add_test(NAME data_prepare_parquet
    COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/data/parquet_inputs.py --data ${_data}
            --text ${ADGT_DATA_E2E}/input.txt --work ${_pq} --pyarrow ${ADGT_ARROW_ROOT}/..)
  set_tests_properties(data_prepare_parquet PROPERTIES FIXTURES_SETUP data_parquet)
  foreach(case "id;a.parquet: column 'id' is int64, not a string column"
               "meta;a.parquet: column 'meta' is struct<body: string, n: int32>, not a string column"
               "meta.n;a.parquet: column 'meta.n' is int32, not a string column"
               "body;a.parquet: no column 'body' \\(the file has id, text, meta\\)"
               "text.x;a.parquet: column 'text' is string, not a struct")
    list(GET case 0 _field)
    list(GET case 1 _pattern)
    add_test(NAME data_parquet_field_${_field}
      COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh "${_pattern}" --
              ${_data} prepare --input ${_pq}/corpus/a.parquet --out ${_pq}/err_${_field} --tokenizer byte --text-field ${_field})
    set_tests_properties(data_parquet_field_${_field} PROPERTIES FIXTURES_REQUIRED data_parquet)
  endforeach()
  add_test(NAME data_parquet_damaged_fail
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh
            "damaged.parquet:4: row group 1 \\(rows 4-6\\): .*checksum.* \\(--on-bad-record fail\\)" --
            ${_data} prepare --input ${_pq}/damaged.parquet --out ${_pq}/err_damaged --tokenizer byte --on-bad-record fail)
  set_tests_properties(data_parquet_damaged_fail PROPERTIES FIXTURES_REQUIRED data_parquet)
else()
  file(WRITE ${_pq}/t.parquet "PAR1")
  add_test(NAME data_parquet_refused
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh
            "t.parquet: this build reads no Parquet .*run scripts/install_deps.sh" --
            ${_data} prepare --input ${_pq}/t.parquet --out ${_pq}/err --tokenizer byte)
endif()

# Errors exit non-zero and name the file / flag.
function(adgt_data_error_test name pattern)
  add_test(NAME ${name}
    COMMAND sh -c "out=$(\"$0\" \"$@\" 2>&1); rc=$?; echo \"$out\"; [ $rc -ne 0 ] && echo \"$out\" | grep -q -- \"${pattern}\""
            ${_data} ${ARGN})
endfunction()
adgt_data_error_test(data_error_missing_input "nope.txt': no such file, directory or match"
  prepare --input ${ADGT_DATA_E2E}/nope.txt --out ${ADGT_DATA_E2E}/err)
adgt_data_error_test(data_error_bad_vocab "--vocab-size 10 is out of range"
  prepare --input ${ADGT_DATA_E2E}/input.txt --out ${ADGT_DATA_E2E}/err --vocab-size 10)
adgt_data_error_test(data_error_bad_val_fraction "--val-fraction"
  prepare --input ${ADGT_DATA_E2E}/input.txt --out ${ADGT_DATA_E2E}/err --val-fraction 0.9)
adgt_data_error_test(data_error_bad_tokenizer "missing.model"
  prepare --input ${ADGT_DATA_E2E}/input.txt --out ${ADGT_DATA_E2E}/err
  --tokenizer ${ADGT_DATA_E2E}/missing.model)
file(WRITE ${ADGT_DATA_E2E}/empty.txt " \n\n")
adgt_data_error_test(data_error_empty_input "empty.txt' is empty"
  prepare --input ${ADGT_DATA_E2E}/empty.txt --out ${ADGT_DATA_E2E}/err)

# The sampler definition in docs/data-format.md (a Python block) is executable:
# it must give exactly the windows `adgt-data order` reports.
add_test(NAME data_sampler_matches_doc
  COMMAND ${ADGT_PYTHON} -c [=[
import re, subprocess, sys
doc, exe, shard = sys.argv[1:4]
code = re.search(r'```python\n(M64 = .*?)```', open(doc).read(), re.S).group(1)
ns = {}
exec(code, ns)
for seed in (0, 99, 2**64 - 1):
    out = subprocess.run([exe, 'order', '--shard', shard, '--seq-len', '7', '--seed', str(seed),
                          '--count', '1000'], capture_output=True, text=True, check=True).stdout
    lines = out.split('\n')
    W = int(lines[0].split()[-1])
    got = [int(x) for x in lines[1].split()]
    want = [ns['window_of'](i, W, seed) for i in range(1000)]
    if got != want:
        sys.exit('seed %d: adgt-data order disagrees with docs/data-format.md' % seed)
print('ok: W =', W, '1000 samples x 3 seeds match')
]=] ${CMAKE_SOURCE_DIR}/docs/data-format.md $<TARGET_FILE:adgt-data> ${ADGT_DATA_E2E}/bpe/val.bin)
set_tests_properties(data_sampler_matches_doc PROPERTIES FIXTURES_REQUIRED data_bpe)

# Megatron-LM indexed datasets and llm.c shards, read in place: the script
# writes the byte-level KJV shards' token ids in each project's own layout
# (numpy and struct, not their code) and checks reading, training and errors.
if(TARGET adgt-train)
  foreach(check read train errors)
    add_test(NAME data_foreign_${check}
      COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/data/foreign_tokens_check.py ${check}
              --data-exe $<TARGET_FILE:adgt-data> --train-exe $<TARGET_FILE:adgt-train>
              --shards ${CMAKE_BINARY_DIR}/data/kjv-byte
              --model ${CMAKE_CURRENT_SOURCE_DIR}/layouts/model.yaml
              --work ${CMAKE_BINARY_DIR}/tests/data_foreign)
    set_tests_properties(data_foreign_${check} PROPERTIES FIXTURES_REQUIRED kjv_byte
      ENVIRONMENT "OMP_NUM_THREADS=1")
  endforeach()
endif()

# The tokenizer.json reader against HuggingFace tokenizers (the oracle in
# .deps/python, scripts/install_deps.sh): GPT-2- and Llama-3-style byte-level
# BPE files trained by tokenizers in the test, 0.3 MB of mixed text each,
# ids equal and decode(encode(x)) == x (docs/data-format.md, "Tokenizers").
add_test(NAME data_hf_tokenizer_parity
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/data/hf_tokenizer_parity.py --data ${_data}
          --text ${CMAKE_BINARY_DIR}/data/kjv-byte/kjv.txt --work ${CMAKE_BINARY_DIR}/tests/data_hf_tokenizer)
set_tests_properties(data_hf_tokenizer_parity PROPERTIES FIXTURES_REQUIRED kjv_byte TIMEOUT 300)

# A two-source blend in training: shares, resume and a resume into dp=2
# continue the same order (docs/data-format.md, "Blends").
if(TARGET adgt-train)
  add_test(NAME data_blend_train
    COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/data/blend_train.py --train $<TARGET_FILE:adgt-train>
            --data ${_data} --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
            --model ${CMAKE_CURRENT_SOURCE_DIR}/layouts/model.yaml --shard ${CMAKE_BINARY_DIR}/data/kjv-byte/train.bin
            --text ${ADGT_DATA_E2E}/input.txt --work ${CMAKE_BINARY_DIR}/tests/data_blend)
  set_tests_properties(data_blend_train PROPERTIES FIXTURES_REQUIRED kjv_byte TIMEOUT 600 LABELS parallel)
  # A blend in data.val, written as a list (the run's printed config): each
  # source's val loss == that source alone, in one process, dp=2 and tp=2;
  # val_loss their weighted mean; against PyTorch float64 where installed.
  add_test(NAME data_blend_val
    COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/data/blend_val.py --train $<TARGET_FILE:adgt-train>
            --data ${_data} --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
            --model ${CMAKE_CURRENT_SOURCE_DIR}/layouts/model.yaml --shards ${CMAKE_BINARY_DIR}/data/kjv-byte
            --text ${ADGT_DATA_E2E}/input.txt --work ${CMAKE_BINARY_DIR}/tests/data_blend_val)
  set_tests_properties(data_blend_val PROPERTIES FIXTURES_REQUIRED kjv_byte TIMEOUT 600 LABELS parallel)
endif()

# Damaged inputs (scripts/data/fuzz_inputs.py, docs/data-format.md "Damaged
# inputs"): 40 cases taking every class in turn -- cut and corrupt .gz/.zst,
# bad UTF-8, bad JSON lines, damaged tokenizer files, Megatron, llm.c and
# adgt token files, token files read by adgt-train -- each a named error or
# a counted skip, none a crash, hang, unnamed error or silent drop; first the
# runner's verdicts on stand-ins that crash, hang, fail unnamed and drop input.
set(_fuzz_train "")
if(TARGET adgt-train)
  set(_fuzz_train --train $<TARGET_FILE:adgt-train> --model ${CMAKE_CURRENT_SOURCE_DIR}/layouts/model.yaml)
endif()
add_test(NAME data_fuzz_inputs
  COMMAND sh -c "py=$0 s=$1 w=$2; shift 2; \"$py\" \"$s/fuzz_run.py\" --self-test && \"$py\" \"$s/fuzz_inputs.py\" --out \"$w\" --count 40 --seed 20 --skip parquet && \"$py\" \"$s/fuzz_run.py\" --cases \"$w\" --timeout 60 --check \"$@\""
          ${ADGT_PYTHON} ${CMAKE_SOURCE_DIR}/scripts/data ${CMAKE_BINARY_DIR}/tests/data_fuzz
          --data ${_data} ${_fuzz_train})
set_tests_properties(data_fuzz_inputs PROPERTIES TIMEOUT 120 ENVIRONMENT "OMP_NUM_THREADS=1")
# Damaged Parquet files (written by the pyarrow wheel): wrong column types, a
# missing column, cut files, changed bytes, not Parquet at all.
if(ADGT_HAVE_PARQUET)
  add_test(NAME data_fuzz_parquet
    COMMAND sh -c "py=$0 s=$1 w=$2; shift 2; \"$py\" \"$s/fuzz_inputs.py\" --out \"$w\" --count 24 --seed 3 --only parquet && \"$py\" \"$s/fuzz_run.py\" --cases \"$w\" --timeout 60 --check \"$@\""
            ${ADGT_PYTHON} ${CMAKE_SOURCE_DIR}/scripts/data ${CMAKE_BINARY_DIR}/tests/data_fuzz_parquet
            --data ${_data})
  set_tests_properties(data_fuzz_parquet PROPERTIES TIMEOUT 120)
endif()
