# Kernel emulation (docs/cuda.md): every handwritten CUDA kernel family
# runs in the host emulation of CUDA (tests/tools/cuda_sim/) against the CPU
# backend, from the very kernel headers the CUDA backend compiles
# (kernels/cuda/*_kernels.cuh, with their launch code). Plain C++: built and
# run with or without the CUDA toolkit. See tests/kernel_sim/sim_check.hpp.
#
# Each family also has deliberate bugs (mutants): a copy of its kernel header
# with one text replaced, built into the same test, which must then fail
# (ctest kernel_sim_mutant_<name>). A mutant whose text is no longer found
# exactly once in the header stops the build, so a mutant cannot silently
# stop mutating.

# adgt_kernel_sim(<family>): tests/kernel_sim/<family>_sim_test.cpp, ctest
# kernel_sim_<family>.
function(adgt_kernel_sim family)
  add_executable(adgt_kernel_sim_${family}
    ${CMAKE_CURRENT_SOURCE_DIR}/kernel_sim/${family}_sim_test.cpp)
  target_link_libraries(adgt_kernel_sim_${family} PRIVATE adgt_kernels Boost::context)
  # Optimised (the emulation is ~10x slower at -O0); nvcc's aliasing rules.
  target_compile_options(adgt_kernel_sim_${family} PRIVATE -O2 -fno-strict-aliasing
    -Wno-unknown-pragmas)
  add_test(NAME kernel_sim_${family} COMMAND adgt_kernel_sim_${family})
  set_tests_properties(kernel_sim_${family} PROPERTIES LABELS "cuda;kernel_sim" TIMEOUT 300)
endfunction()

# adgt_kernel_mutant(<name> TEST <family> HEADER <kernels/cuda/x.cuh>
#                    FROM <text> TO <text> [SOURCE <test.cpp>] [ARGS <args>]):
# the family's test (tests/kernel_sim/<family>_sim_test.cpp, or SOURCE)
# built against the header with FROM (found exactly once) replaced by TO and
# run with ARGS; ctest kernel_sim_mutant_<name> passes when that test fails by
# a check ("FAIL") or an emulation error ("cuda-sim:").
function(adgt_kernel_mutant name)
  cmake_parse_arguments(PARSE_ARGV 1 M "" "TEST;HEADER;FROM;TO;SOURCE" "ARGS")
  set(src ${CMAKE_CURRENT_SOURCE_DIR}/kernel_sim/${M_TEST}_sim_test.cpp)
  if(M_SOURCE)
    set(src ${CMAKE_CURRENT_SOURCE_DIR}/${M_SOURCE})
  endif()
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/kernel_sim_mutants/${name})
  set(spec ${dir}/mutation.cmake)
  file(WRITE ${spec}.in "set(FROM [==[${M_FROM}]==])\nset(TO [==[${M_TO}]==])\n")
  configure_file(${spec}.in ${spec} COPYONLY)
  add_custom_command(OUTPUT ${dir}/${M_HEADER}
    COMMAND ${CMAKE_COMMAND} -DSPEC=${spec} -DSRC=${CMAKE_SOURCE_DIR}/${M_HEADER}
      -DOUT=${dir}/${M_HEADER} -P ${CMAKE_CURRENT_SOURCE_DIR}/kernel_sim/mutate.cmake
    DEPENDS ${CMAKE_SOURCE_DIR}/${M_HEADER} ${spec}
      ${CMAKE_CURRENT_SOURCE_DIR}/kernel_sim/mutate.cmake
    COMMENT "kernel mutant ${name}")
  add_executable(adgt_kernel_mutant_${name} ${src} ${dir}/${M_HEADER})
  target_include_directories(adgt_kernel_mutant_${name} BEFORE PRIVATE ${dir})
  target_link_libraries(adgt_kernel_mutant_${name} PRIVATE adgt_kernels Boost::context)
  target_compile_options(adgt_kernel_mutant_${name} PRIVATE -O2 -fno-strict-aliasing
    -Wno-unknown-pragmas)
  add_test(NAME kernel_sim_mutant_${name}
    COMMAND ${CMAKE_COMMAND} -DBIN=$<TARGET_FILE:adgt_kernel_mutant_${name}> "-DARGS=${M_ARGS}"
      -P ${CMAKE_CURRENT_SOURCE_DIR}/kernel_sim/expect_failure.cmake)
  set_tests_properties(kernel_sim_mutant_${name} PROPERTIES LABELS "cuda;kernel_sim" TIMEOUT 300)
endfunction()

adgt_kernel_sim(rmsnorm)
adgt_kernel_mutant(rmsnorm_warp_only TEST rmsnorm HEADER kernels/cuda/rmsnorm_kernels.cuh
  # the bf16 forward's row sum of squares reduced within each warp only
  FROM [[  ss = block_sum(ss, red);
  const float r = math::rmsnorm_rstd]]
  TO [[  ss = warp_sum(ss);
  const float r = math::rmsnorm_rstd]])
adgt_kernel_mutant(rmsnorm_dw_rows TEST rmsnorm HEADER kernels/cuda/rmsnorm_kernels.cuh
  # the two-pass weight gradient drops the last row block's partial
  FROM [[for (int64_t rb = 0; rb < nrb; ++rb) s += part[rb * C + c];]]
  TO [[for (int64_t rb = 0; rb + 1 < nrb; ++rb) s += part[rb * C + c];]])

adgt_kernel_sim(attention)

adgt_kernel_sim(attention_block)
adgt_kernel_mutant(attention_block_merge_empty TEST attention_block
  HEADER kernels/cuda/attention_block_kernels.cuh
  # the merge into a running lse of -inf weighs its (undefined) out by 0
  # instead of taking the block's row: 0 * NaN
  FROM [[if (l == T(-INFINITY)) {]]
  TO [[if (false) {]])
adgt_kernel_mutant(attention_block_d_from_p TEST attention_block
  HEADER kernels/cuda/attention_block_kernels.cuh
  # the backward computes D from the block's own P and dP (right for a whole
  # attention, wrong for one block of it) instead of rowsum(dout * out)
  FROM [[d.d_given = true;]]
  TO [[d.d_given = false;]])
adgt_kernel_mutant(attention_block_full_dkv_rows TEST attention_block
  HEADER kernels/cuda/attention_kernels.cuh
  # dK/dV of a full block take only the query rows from the key's own index
  # on, as if the block were causal
  FROM [[return s.full ? 0 : j;]]
  TO [[return j;]])
adgt_kernel_mutant(attention_block_doc_offset TEST attention_block
  HEADER kernels/cuda/attention_kernels.cuh
  # packed documents in a block: a row's first key taken as its document's
  # start in sequence positions, not less the block's first key position
  FROM [[const int64_t f = int64_t(s.doc[b * s.T + i]) - s.doc_off;]]
  TO [[const int64_t f = int64_t(s.doc[b * s.T + i]);]])
adgt_kernel_mutant(attention_block_doc_key_rows TEST attention_block
  HEADER kernels/cuda/attention_kernels.cuh
  # dK/dV: a key's rows end where documents start after its index in the
  # block, not after its position in the sequence
  FROM [[if (ds[mid] > pos)]]
  TO [[if (ds[mid] > j)]])
adgt_kernel_mutant(attention_block_key_stride TEST attention_block
  HEADER kernels/cuda/attention_kernels.cuh
  # the forward steps over a sequence's keys by the query length Tq
  FROM [[const T* Q = q + (b * s.T + i) * ldq + h * hd;
  const T* K = k + b * s.Tk * ldk + kh * hd;]]
  TO [[const T* Q = q + (b * s.T + i) * ldq + h * hd;
  const T* K = k + b * s.T * ldk + kh * hd;]])
adgt_kernel_mutant(attention_block_dq_overwrite TEST attention_block
  HEADER kernels/cuda/attention_kernels.cuh
  # accumulate_dq ignored: dq overwritten
  FROM [[dq[qoff + e] = s.acc_dq ? dq[qoff + e] + scale * acc : scale * acc;]]
  TO [[dq[qoff + e] = scale * acc;]])

adgt_kernel_sim(pointwise)

adgt_kernel_sim(classifier)
adgt_kernel_mutant(classifier_bf16_warp_merge TEST classifier HEADER kernels/cuda/loss_kernels.cuh
  # the bf16 (max, sum) warp merge stops one shuffle short: odd lanes' parts are dropped
  FROM [[  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_down_sync(0xffffffffu, m, o);
    const float s2 = __shfl_down_sync(0xffffffffu, s, o);
    merge_part(m, s, m2, s2);
  }
  if (lane == 0)]]
  TO [[  for (int o = 16; o > 1; o >>= 1) {
    const float m2 = __shfl_down_sync(0xffffffffu, m, o);
    const float s2 = __shfl_down_sync(0xffffffffu, s, o);
    merge_part(m, s, m2, s2);
  }
  if (lane == 0)]])
adgt_kernel_mutant(classifier_bf16_vec_max TEST classifier HEADER kernels/cuda/loss_kernels.cuh
  # a bf16 vector's exponentials taken against the running max, not the vector's own
  FROM [[for (int k = 0; k < 8; ++k) s8 += expf(x[k] - m8);]]
  TO [[for (int k = 0; k < 8; ++k) s8 += expf(x[k] - m);]])
adgt_kernel_mutant(classifier_combine_rescale TEST classifier HEADER kernels/cuda/loss_kernels.cuh
  # ce_combine adds the ranks' sums without rescaling them to the global max
  FROM [[    S += s[1] * dexp(s[0] - M);]]
  TO [[    S += s[1];]])
adgt_kernel_mutant(classifier_finish_target TEST classifier HEADER kernels/cuda/loss_kernels.cuh
  # f32/f64 ce_finish: off by one in the target's shard test (the next shard's first column)
  FROM [[if (threadIdx.x == 0 && t >= 0 && t < valid) row[t] -= gs;]]
  TO [[if (threadIdx.x == 0 && t >= 0 && t <= valid) row[t] -= gs;]])
adgt_kernel_mutant(classifier_range_check TEST classifier HEADER kernels/cuda/loss_kernels.cuh
  # f32/f64 cross_entropy's device range check lets target == V through
  FROM [[  if (tg < 0 || tg >= V) {
    if (threadIdx.x == 0) {
      losses[i] = tg < 0 ? T(0) : T(NAN);]]
  TO [[  if (tg < 0 || tg > V) {
    if (threadIdx.x == 0) {
      losses[i] = tg < 0 ? T(0) : T(NAN);]])

adgt_kernel_sim(optimizer)
adgt_kernel_mutant(optimizer_adamw_bc2 TEST optimizer HEADER kernels/cuda/optimizer_kernels.cuh
  # adamw's second-moment bias correction passed without its square root
  FROM [[T(bc1), T(std::sqrt(bc2))]]
  TO [[T(bc1), T(bc2)]])
adgt_kernel_mutant(optimizer_adamw_cast_width TEST optimizer HEADER kernels/cuda/optimizer_kernels.cuh
  # adamw_cast's vector step stores only the first element of the bf16 copy
  FROM [[    stv<W>(lo + i, pp);]]
  TO [[    stv<1>(lo + i, pp);]])
adgt_kernel_mutant(optimizer_sumsq_tail TEST optimizer HEADER kernels/cuda/optimizer_kernels.cuh
  # the vectorised sum of squares drops the last element of the final chunk's remainder
  FROM [[  if (body + threadIdx.x < hi) {]]
  TO [[  if (body + threadIdx.x + 1 < hi) {]])
adgt_kernel_mutant(optimizer_sumsq_warp_only TEST optimizer HEADER kernels/cuda/optimizer_kernels.cuh
  # the f64 first pass reduces each chunk within each warp only
  FROM [[    s += v * v;
  }
  s = block_sum(s, red);]]
  TO [[    s += v * v;
  }
  s = warp_sum(s);]])

adgt_kernel_sim(embedding)
adgt_kernel_sim(combine)
adgt_kernel_sim(moe_routing)
adgt_kernel_mutant(moe_route_tie_high TEST moe_routing HEADER kernels/cuda/moe_routing_kernels.cuh
  # ties go to the higher expert id
  FROM [[if (best < 0 || score > best_score) best = e, best_score = score;]]
  TO [[if (best < 0 || score >= best_score) best = e, best_score = score;]])
adgt_kernel_mutant(moe_plan_scan_inclusive TEST moe_routing HEADER kernels/cuda/moe_routing_kernels.cuh
  # the block scan returns the inclusive prefix: every rank one too high
  FROM [[return before + v - f;]]
  TO [[return before + v;]])
adgt_kernel_mutant(moe_plan_capacity_off_by_one TEST moe_routing HEADER kernels/cuda/moe_routing_kernels.cuh
  # capacity keeps one assignment too many per expert and group
  FROM [[pos[a] = r < cap ? int32_t(kept + r - kept0) : -1;]]
  TO [[pos[a] = r <= cap ? int32_t(kept + r - kept0) : -1;]])
adgt_kernel_mutant(moe_plan_prior_ignored TEST moe_routing HEADER kernels/cuda/moe_routing_kernels.cuh
  # a run of a larger capacity group counts from 0, not from its prior
  FROM [[int64_t carry = p0;]]
  TO [[int64_t carry = 0;]])
adgt_kernel_mutant(moe_plan_prior_past_cap TEST moe_routing HEADER kernels/cuda/moe_routing_kernels.cuh
  # a prior past the cap is not clamped: the kept count goes negative
  FROM [[const int64_t kept0 = p0 < cap ? p0 : cap;]]
  TO [[const int64_t kept0 = p0;]])
adgt_kernel_mutant(moe_plan_carry_dropped TEST moe_routing HEADER kernels/cuda/moe_routing_kernels.cuh
  # the scan's carry is not kept from one chunk of the block to the next
  FROM [[      carry += tot;
    }]]
  TO [[      carry = tot;
    }]])
adgt_kernel_mutant(moe_router_bwd_no_center TEST moe_routing HEADER kernels/cuda/moe_routing_kernels.cuh
  # the renormalisation's centring term (sum_i dw_i weight_i) is left out
  FROM [[if (ch[j] == e) v += (double(d[j]) - sdw) / nt;]]
  TO [[if (ch[j] == e) v += double(d[j]) / nt;]])
adgt_kernel_mutant(pointwise_add_stride TEST pointwise HEADER kernels/cuda/pointwise_kernels.cuh
  # add_kernel strides by one block, not the grid: blocks past the first add twice
  FROM [[       i += int64_t(gridDim.x) * blockDim.x)
    y[i] += x[i];]]
  TO [[       i += int64_t(blockDim.x))
    y[i] += x[i];]])
adgt_kernel_mutant(pointwise_scale_factor TEST pointwise HEADER kernels/cuda/pointwise_kernels.cuh
  # scale_inplace rounds the factor to f32 before the f64 kernel uses it
  FROM [[x.ptr<T>(), T(s), n);]]
  TO [[x.ptr<T>(), T(float(s)), n);]])
adgt_kernel_mutant(pointwise_cast_double_rounding TEST pointwise HEADER kernels/cuda/pointwise_kernels.cuh
  # f64 -> bf16 through a rounded f32 (the cast before this header): two roundings
  FROM [[      d[i] = f64_to_bf16(s[i]);]]
  TO [[      d[i] = float_to_bf16(float(s[i]));]])
adgt_kernel_mutant(pointwise_cast_vec_src TEST pointwise HEADER kernels/cuda/pointwise_kernels.cuh
  # the f32 <-> bf16 casts vectorise with src misaligned
  FROM [[const bool vec = aligned16(dst.data) && aligned16(src.data);]]
  TO [[const bool vec = aligned16(dst.data);]])
adgt_kernel_mutant(pointwise_swiglu_sigmoid TEST pointwise HEADER kernels/cuda/pointwise_kernels.cuh
  # the bf16 SwiGLU backward takes sigmoid(-g) for sigmoid(g)
  FROM [[math::swiglu_grad(a[k], b[k], d[k], 1.f / (1.f + expf(-a[k])), x, y);]]
  TO [[math::swiglu_grad(a[k], b[k], d[k], 1.f / (1.f + expf(a[k])), x, y);]])
adgt_kernel_mutant(pointwise_swiglu_swapped TEST pointwise HEADER kernels/cuda/pointwise_kernels.cuh
  # the f32/f64 SwiGLU backward stores dgate and dup in each other's place
  FROM [[    dg[j] = a;
    du[j] = b;]]
  TO [[    dg[j] = b;
    du[j] = a;]])
adgt_kernel_mutant(pointwise_rope_position TEST pointwise HEADER kernels/cuda/pointwise_kernels.cuh
  # the bf16 rotary takes the position from the (row, head) index, not the row
  FROM [[t = (rh / H) % Tn;]]
  TO [[t = rh % Tn;]])
adgt_kernel_mutant(pointwise_rope_back TEST pointwise HEADER kernels/cuda/pointwise_kernels.cuh
  # the f32/f64 rotary backward rotates forward (not by the transpose)
  FROM [[      math::rope_rotate_back(av, bv, cs[t * half + i], sn[t * half + i]);]]
  TO [[      math::rope_rotate(av, bv, cs[t * half + i], sn[t * half + i]);]])
adgt_kernel_mutant(pointwise_packed_row_stride TEST pointwise HEADER kernels/cuda/pointwise_kernels.cuh
  # the packed gate/up rows are taken F apart, not 2F: gate and up read from the wrong rows
  FROM [[return ld == F ? i : i / F * ld + i % F;]]
  TO [[return ld == F ? i : i / F * F + i % F;]])
adgt_kernel_mutant(pointwise_qkv_position TEST pointwise HEADER kernels/cuda/pointwise_kernels.cuh
  # the fused q/k/v rotary takes the position from the (row, head) index, not the row
  FROM [[const int64_t tab = (row % Tn) * half + p;]]
  TO [[const int64_t tab = (rh % Tn) * half + p;]])
adgt_kernel_mutant(embedding_offsets_carry TEST embedding HEADER kernels/cuda/embedding_kernels.cuh
  # the offsets scan drops the runs of the earlier 1024-tile chunks
  FROM [[if (b < tiles) cnt[b] = carry + off;]]
  TO [[if (b < tiles) cnt[b] = off;]])
adgt_kernel_mutant(embedding_scan_reuse TEST embedding HEADER kernels/cuda/embedding_kernels.cuh
  # no barrier before the offsets scan's storage is reused by the next chunk
  FROM [[__syncthreads();  // tmp is reused]]
  TO [[// (tmp reused without a barrier)]])
adgt_kernel_mutant(embedding_tile_offset TEST embedding HEADER kernels/cuda/embedding_kernels.cuh
  # the run starts are placed by the tile-local scan only, without the tile's offset
  FROM [[off += tile_off[blockIdx.x];]]
  TO [[]])
adgt_kernel_mutant(embedding_run_rows TEST embedding HEADER kernels/cuda/embedding_kernels.cuh
  # f32/f64 per-run sum indexes dout by sorted position instead of token row
  FROM [[for (int32_t k = k0; k < k1; ++k) acc += dout[int64_t(idx[k]) * C + c];]]
  TO [[for (int32_t k = k0; k < k1; ++k) acc += dout[int64_t(k) * C + c];]])
adgt_kernel_mutant(embedding_last_run TEST embedding HEADER kernels/cuda/embedding_kernels.cuh
  # the last run ends one row early (off by one at N)
  FROM [[k1 = b + 1 < n ? starts[b + 1] : N;]]
  TO [[k1 = b + 1 < n ? starts[b + 1] : N - 1;]])
adgt_kernel_mutant(embedding_bf16_stride TEST embedding HEADER kernels/cuda/embedding_kernels.cuh
  # bf16 per-run sum: the column stride not scaled by W (W = 8 columns added twice)
  FROM [[c < C; c += int64_t(blockDim.x) * W) {]]
  TO [[c < C; c += int64_t(blockDim.x)) {]])
adgt_kernel_mutant(combine_overwrite TEST combine HEADER kernels/cuda/combine_kernels.cuh
  # the overwrite form adds onto out's old contents
  FROM [[A acc = accumulate ? load_a(o[c]) : A(0);]]
  TO [[A acc = load_a(o[c]);]])
adgt_kernel_mutant(combine_drop_break TEST combine HEADER kernels/cuda/combine_kernels.cuh
  # a dropped slot (pos < 0) ends the row: the later experts are lost
  FROM [[if (r < 0) continue;]]
  TO [[if (r < 0) break;]])
adgt_kernel_mutant(combine_dw_warp TEST combine HEADER kernels/cuda/combine_kernels.cuh
  # dw reduced within each warp only: the other warps' columns are lost
  FROM [[s = block_sum(s, red);]]
  TO [[s = warp_sum(s);]])
# T = 257, past the block of 256 threads (the softmax and D loops' second
# stride): the emulation's cost grows with T^2, so a test of its own.
add_test(NAME kernel_sim_attention_long COMMAND adgt_kernel_sim_attention long)
set_tests_properties(kernel_sim_attention_long PROPERTIES LABELS "cuda;kernel_sim" TIMEOUT 300)
adgt_kernel_mutant(attention_causal_diag TEST attention HEADER kernels/cuda/attention_kernels.cuh
  # dK/dV start their query rows past the diagonal: the i = j term is lost
  FROM [[const int64_t ibeg = key_first_row(s, j);]]
  TO [[const int64_t ibeg = key_first_row(s, j) + 1;]])
adgt_kernel_mutant(attention_gqa_map TEST attention HEADER kernels/cuda/attention_kernels.cuh
  # the forward maps query head h to kv head h % KV (interleaved), not h / group
  FROM [[kh = h / s.group;
  const int64_t hd = s.hd, ldq = s.H * hd, ldk = s.KV * hd;
  const T* Q = q + (b * s.T + i) * ldq + h * hd;]]
  TO [[kh = h % s.KV;
  const int64_t hd = s.hd, ldq = s.H * hd, ldk = s.KV * hd;
  const T* Q = q + (b * s.T + i) * ldq + h * hd;]])
adgt_kernel_mutant(attention_dkv_barrier TEST attention HEADER kernels/cuda/attention_kernels.cuh
  # the dK/dV chunk loop lacks its closing barrier: the next chunk's p and dS
  # overwrite the shared rows other warps still read
  FROM [[          acck += dsc[ii] * Q[i * ldq + d];
        }
      }
      __syncthreads();]]
  TO [[          acck += dsc[ii] * Q[i * ldq + d];
        }
      }]])
adgt_kernel_mutant(attention_doc_forward TEST attention HEADER kernels/cuda/attention_kernels.cuh
  # the forward ignores the document mask: every row's keys start at 0
  FROM [[const int64_t j0 = row_first_key(s, b, i);  // keys [j0, je)
  const int64_t je = row_end_key(s, i);
  T mx]]
  TO [[const int64_t j0 = 0;
  const int64_t je = row_end_key(s, i);
  T mx]])
adgt_kernel_mutant(attention_doc_dkv_rows TEST attention HEADER kernels/cuda/attention_kernels.cuh
  # dK/dV take every later query row, masked or not
  FROM [[const int64_t iend = key_rows_end(s, b, j);]]
  TO [[const int64_t iend = s.T;]])
adgt_kernel_mutant(attention_doc_rows_search TEST attention HEADER kernels/cuda/attention_kernels.cuh
  # the search ends a key's rows at the document starting at the key itself
  FROM [[if (ds[mid] > pos)]]
  TO [[if (ds[mid] >= pos)]])
adgt_kernel_mutant(attention_bf16_tail TEST attention HEADER kernels/cuda/attention_kernels.cuh
  # the fp32-to-bf16 conversion stops one element short of n
  FROM [[const float* __restrict__ src,
                                   int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;]]
  TO [[const float* __restrict__ src,
                                   int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i + 1 < n;]])
adgt_kernel_mutant(combine_pos_unchecked TEST combine HEADER kernels/cuda/combine_kernels.cuh
  # the forward no longer checks row indices against y's rows (reads outside y)
  FROM [[      if (r >= M) {
        if (c == threadIdx.x) report_bad_pos(err, t * k + j, r, M);
        continue;
      }]]
  TO [[]])
# Document masking in the flash kernels (tests/tools/flash_sim_test.cpp, run
# on its document-masked cases: `docs`).
adgt_kernel_mutant(flash_doc_fwd_mask TEST flash SOURCE tools/flash_sim_test.cpp ARGS docs
  HEADER kernels/cuda/flash_attention_kernels.cuh
  # the forward's per-element document mask never masks
  FROM [[if (key0 + nt * 8 + 2 * t4 + (c & 1) < dlo[c >> 1]) s[nt][c] = -INFINITY;]]
  TO [[if (key0 + nt * 8 + 2 * t4 + (c & 1) < 0) s[nt][c] = -INFINITY;]])
adgt_kernel_mutant(flash_doc_first_block TEST flash SOURCE tools/flash_sim_test.cpp ARGS docs
  HEADER kernels/cuda/flash_attention_kernels.cuh
  # the forward and dQ start at the block after the one holding the document start
  FROM [[return d > 0 ? d / kBlock : 0;]]
  TO [[return d > 0 ? (d + kBlock - 1) / kBlock : 0;]])
adgt_kernel_mutant(flash_doc_dq_mask TEST flash SOURCE tools/flash_sim_test.cpp ARGS docs
  HEADER kernels/cuda/flash_attention_kernels.cuh
  # dQ keeps P of keys before the row's document start
  FROM [[if (docm && key < dlo[c >> 1]) pr = 0.f;]]
  TO [[]])
adgt_kernel_mutant(flash_doc_dkdv_mask TEST flash SOURCE tools/flash_sim_test.cpp ARGS docs
  HEADER kernels/cuda/flash_attention_kernels.cuh
  # dK/dV keep P^T of queries whose document starts after the key
  FROM [[if (qi < p.T && kj < ds[qi] - p.doc_off) s[nt][c] = 0.f;]]
  TO [[]])
adgt_kernel_mutant(flash_doc_dkdv_end TEST flash SOURCE tools/flash_sim_test.cpp ARGS docs
  HEADER kernels/cuda/flash_attention_kernels.cuh
  # dK/dV stop at a query block starting its document inside the key block
  FROM [[if (ds[(qb0 + mid - 1) * kBlock] - off <= klast)]]
  TO [[if (ds[(qb0 + mid - 1) * kBlock] - off <= kb * kBlock)]])
adgt_kernel_mutant(flash_doc_dkdv_last_key TEST flash SOURCE tools/flash_sim_test.cpp ARGS docs
  HEADER kernels/cuda/flash_attention_kernels.cuh
  # dK/dV stop at a query block whose document starts at the key block's last key
  FROM [[if (ds[(qb0 + mid - 1) * kBlock] - off <= klast)]]
  TO [[if (ds[(qb0 + mid - 1) * kBlock] - off < klast)]])

# Ring attention's blocks in the flash kernels (block_params; flash_sim_test
# `blocks`: a full block of Tk1 keys and the causal diagonal merged, dq
# accumulated).
adgt_kernel_mutant(flash_block_fwd_ragged TEST flash SOURCE tools/flash_sim_test.cpp ARGS blocks
  HEADER kernels/cuda/flash_attention_kernels.cuh
  # the forward of a full block leaves out its ragged last key tile
  FROM [[none (kb0 >= nkb: out 0, lse -inf).
  const int kb0 = first_key_block(ds, qb, p.doc_off);
  const int nkb = FULL ? (Tk + kBlock - 1) / kBlock : qb + 1;]]
  TO [[none (kb0 >= nkb: out 0, lse -inf).
  const int kb0 = first_key_block(ds, qb, p.doc_off);
  const int nkb = FULL ? Tk / kBlock : qb + 1;]])
adgt_kernel_mutant(flash_block_fwd_tail TEST flash SOURCE tools/flash_sim_test.cpp ARGS blocks
  HEADER kernels/cuda/flash_attention_kernels.cuh
  # the forward counts the zero-filled keys past Tk in the softmax
  FROM [[if (key0 + nt * 8 + 2 * t4 + (c & 1) >= kend) s[nt][c] = -INFINITY;]]
  TO [[(void)s;]])
adgt_kernel_mutant(flash_block_fwd_diag TEST flash SOURCE tools/flash_sim_test.cpp ARGS blocks
  HEADER kernels/cuda/flash_attention_kernels.cuh
  # a full block's forward masks its last key tile as a causal diagonal
  FROM [[fwd_mask(s, n * kBlock, !FULL && n == qb,]]
  TO [[fwd_mask(s, n * kBlock, n == qb,]])
adgt_kernel_mutant(flash_block_dq_acc TEST flash SOURCE tools/flash_sim_test.cpp ARGS blocks
  HEADER kernels/cuda/flash_attention_kernels.cuh
  # dQ overwrites where a block accumulates
  FROM [[p.T, lane, p.acc_dq);]]
  TO [[p.T, lane, false);]])
adgt_kernel_mutant(flash_block_dq_diag TEST flash SOURCE tools/flash_sim_test.cpp ARGS blocks
  HEADER kernels/cuda/flash_attention_kernels.cuh
  # dQ of a full block masks as the causal diagonal
  FROM [[const bool diag = !FULL && n == qb;]]
  TO [[const bool diag = n == qb;]])
adgt_kernel_mutant(flash_block_dkdv_first TEST flash SOURCE tools/flash_sim_test.cpp ARGS blocks
  HEADER kernels/cuda/flash_attention_kernels.cuh
  # dK/dV of a full block start at the diagonal's query block
  FROM [[const int qb0 = FULL ? 0 : kb;]]
  TO [[const int qb0 = kb;]])
adgt_kernel_mutant(flash_block_dkdv_mask TEST flash SOURCE tools/flash_sim_test.cpp ARGS blocks
  HEADER kernels/cuda/flash_attention_kernels.cuh
  # dK/dV of a full block mask queries before the key
  FROM [[if ((!FULL && qi < kj) || qi >= p.T) s[nt][c] = 0.f;]]
  TO [[if (qi < kj || qi >= p.T) s[nt][c] = 0.f;]])

adgt_kernel_mutant(flash_block_doc_offset TEST flash SOURCE tools/flash_sim_test.cpp ARGS blocks
  HEADER kernels/cuda/flash_attention_kernels.cuh
  # the forward reads a row's document start as a key index, not from the block's k_pos
  FROM [[const int dlo[2] = {ds ? doc_row(ds, row_lo, p.T) - p.doc_off : 0,]]
  TO [[const int dlo[2] = {ds ? doc_row(ds, row_lo, p.T) : 0,]])
adgt_kernel_mutant(flash_block_no_key TEST flash SOURCE tools/flash_sim_test.cpp ARGS blocks
  HEADER kernels/cuda/flash_attention_kernels.cuh
  # a row that sees no key of the block divides by its zero sum
  FROM [[l[0] > 0.f ? 1.f / l[0] : 0.f]]
  TO [=[1.f / l[0]]=])

adgt_kernel_sim(fp8)
adgt_kernel_mutant(fp8_amax_sign TEST fp8 HEADER kernels/cuda/fp8_kernels.cuh
  # the sign bit is kept: a negative value's bits beat every positive one
  FROM [[return __float_as_uint(v) & 0x7fffffffu;]]
  TO [[return __float_as_uint(v);]])
adgt_kernel_mutant(fp8_amax_accumulate TEST fp8 HEADER kernels/cuda/fp8_kernels.cuh
  # accumulate ignores the old amax
  FROM [[      m = old > m ? old : m;]]
  TO [[      (void)old;]])
adgt_kernel_mutant(fp8_quantize_unscaled TEST fp8 HEADER kernels/cuda/fp8_kernels.cuh
  # the cast forgets the scale
  FROM [[q[i] = float_to_fp8(fp8_load(x, i) * s, Fp8Kind(kind));]]
  TO [[q[i] = float_to_fp8(fp8_load(x, i), Fp8Kind(kind));]])
adgt_kernel_mutant(fp8_transpose_tile TEST fp8 HEADER kernels/cuda/fp8_kernels.cuh
  # the tile is read back in the order it was written: qt is not transposed
  FROM [[qt[c * R + r] = tile[tx][k];]]
  TO [[qt[c * R + r] = tile[k][tx];]])
adgt_kernel_mutant(fp8_dequantize_scale TEST fp8 HEADER kernels/cuda/fp8_kernels.cuh
  # multiplies by the scale instead of dividing
  FROM [[const float v = fp8_to_float(q[i], Fp8Kind(kind)) / s;]]
  TO [[const float v = fp8_to_float(q[i], Fp8Kind(kind)) * s;]])
