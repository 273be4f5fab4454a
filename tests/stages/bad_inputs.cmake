# Hardening: bad inputs get a message naming the problem and the fix and exit code 2; dead or hung
# ranks end the run with an error instead of a hang; nothing is left running (expect_exit.sh checks).
set(S01 $<TARGET_FILE:stage01_allreduce>)
set(S02 $<TARGET_FILE:stage02_naive_ddp>)
set(TINY --bench --preset tiny --context 16 --warmup 0 --steps 2)
# MEM stands in a 24 GB machine (common/measure/memory.hpp), so that the memory refusals are the same on a machine with more.
set(MEM env DP_AVAILABLE_MEMORY_BYTES=24000000000)

# name | expected exit | output regex | command...
# A case whose command is one of this project's programs (after `env K=V ...`, if any) becomes a case of that
# program's ctest `bad_inputs_<program>`: the program starts once and forks per case after LibTorch has loaded
# (tests/support/fork_cases.hpp; ~250 starts of about 1 s each saved), with expect_exit.sh's three checks. Its output
# names each case (`ok   bad_input_<name>`); one alone: DP_FORK_CASES_FILTER=<name> ctest -R bad_inputs_<program>.
# Any other command (the launcher, a script) stays a test of its own, bad_input_<name>, under expect_exit.sh.
function(dp_bad_input name code regex)
  set(cmd ${ARGN})
  set(envs)
  list(GET cmd 0 a)
  while(a STREQUAL "env" OR a MATCHES "^[A-Za-z_][A-Za-z0-9_]*=")  # env K=V env K2=V2 ... (MEM, ALONE)
    if(NOT a STREQUAL "env")
      list(APPEND envs "${a}")
    endif()
    list(POP_FRONT cmd)
    list(GET cmd 0 a)
  endwhile()
  list(GET cmd 0 program)
  # The launcher is no LibTorch program (it starts in milliseconds and has no Cli::parse): its cases stay tests.
  if(NOT program MATCHES "^\\$<TARGET_FILE:([A-Za-z0-9_]+)>$" OR CMAKE_MATCH_1 STREQUAL "ddp_launch")
    dp_add_test(bad_input_${name} LABELS "hardening;cli" TIMEOUT 90 COMMAND ${EXPECT} ${code} ${regex} -- ${ARGN})
    return()
  endif()
  set(target ${CMAKE_MATCH_1})
  list(POP_FRONT cmd)
  set(text "case bad_input_${name}\ncodes ${code}\nregex ${regex}\n")
  foreach(e IN LISTS envs)
    string(APPEND text "env ${e}\n")
  endforeach()
  foreach(a IN LISTS cmd)
    string(APPEND text "arg ${a}\n")
  endforeach()
  set_property(GLOBAL APPEND_STRING PROPERTY DP_FORK_CASES_${target} "${text}end\n")
  set_property(GLOBAL APPEND PROPERTY DP_FORK_CASE_PROGRAMS ${target})
endfunction()

# After every dp_bad_input (tests/CMakeLists.txt calls it last): one case file and one test per program.
function(dp_bad_input_programs)
  get_property(programs GLOBAL PROPERTY DP_FORK_CASE_PROGRAMS)
  list(REMOVE_DUPLICATES programs)
  foreach(p IN LISTS programs)
    get_property(text GLOBAL PROPERTY DP_FORK_CASES_${p})
    set(file ${CMAKE_BINARY_DIR}/tests/bad_inputs/${p}.cases)
    file(GENERATE OUTPUT ${file} CONTENT "${text}")
    # One thread at start-up, so that the cases can be forked: OpenBLAS starts its pool as it loads (the presets
    # set the same; the programs set their own thread counts after start-up).
    # The programs carry no fork server: the test preloads it (tests/support/fork_cases.hpp). The sanitizers want
    # their runtime first among the libraries, and let a preloaded one come before it when told.
    set(preload LD_PRELOAD=$<TARGET_FILE:dp_fork_cases>)
    if(DP_SANITIZE)
      list(APPEND preload ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0:abort_on_error=1)
    endif()
    dp_add_test(bad_inputs_${p} LABELS "hardening;cli" TIMEOUT 300
      COMMAND env OPENBLAS_NUM_THREADS=1 ${preload} DP_FORK_CASES=${file} $<TARGET_FILE:${p}>)
    # Passes on the runner's own verdict line only: a program that ran without the preloaded server (and so
    # without its cases) and exited 0 would otherwise pass.
    set_tests_properties(bad_inputs_${p} PROPERTIES PASS_REGULAR_EXPRESSION "bad-input cases passed \\(PASS\\)")
  endforeach()
endfunction()

# The runner's checks can fail: a wrong exit code, a wrong output and a case past its timeout are each caught.
dp_add_test(bad_inputs_runner_can_fail LABELS "hardening;cli" TIMEOUT 60
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/../fork_cases_can_fail.sh ${S01} $<TARGET_FILE:dp_fork_cases>)

foreach(prog stage01_allreduce stage02_naive_ddp stage03_flat stage04_overlap stage05_bucketed stage06_sharded_opt
             stage07_fsdp stage08_train_lm ext05d_feature_bench ext06d_memory_bench ext07a_fsdp_bench)
  set(P $<TARGET_FILE:${prog}>)
  dp_bad_input(${prog}_unknown_option 2 "--no-such-option" ${P} --no-such-option)
  dp_bad_input(${prog}_missing_value 2 "--timeout" ${P} --timeout)
  dp_bad_input(${prog}_bad_timeout 2 "soon" ${P} --timeout soon)
  if(DP_HAVE_NCCL)  # the cuda build: NCCL is there, the GPU is not (no GPU on the machines that test it)
    dp_bad_input(${prog}_nccl_without_gpu 2 "no GPU" ${P} --backend nccl)
    dp_bad_input(${prog}_cuda_without_gpu 2 "no GPU is visible" ${P} --device cuda)
  else()
    dp_bad_input(${prog}_nccl_on_cpu 2 "no NCCL" ${P} --backend nccl)
    dp_bad_input(${prog}_cuda_on_cpu_build 2 "this build has no CUDA" ${P} --device cuda)
  endif()
  dp_bad_input(${prog}_unknown_backend 2 "mpi" ${P} --backend mpi)
  dp_bad_input(${prog}_help 0 "Options" ${P} --help)
  dp_bad_input(${prog}_unreachable_master 2 "rendezvous at 127.0.0.1:9 failed"
    env RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=9 ${P} --timeout 2s)
  dp_bad_input(${prog}_bad_rank_env 2 "RANK=5 is not below WORLD_SIZE=2" env RANK=5 WORLD_SIZE=2 ${P})
  # Every output file is checked before any work (the benchmark of stage 06 used to run to its end first).
  dp_bad_input(${prog}_json_unwritable 2 "--json /nonexistent-dir/r.json: cannot write there: the folder /nonexistent-dir does not exist"
    ${P} --json /nonexistent-dir/r.json)
  dp_bad_input(${prog}_json_is_a_folder 2 "--json '/tmp': cannot write there: it names a folder" ${P} --json /tmp)
  dp_add_test(bad_input_${prog}_port_in_use LABELS "hardening;cli" TIMEOUT 90
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/../port_in_use.sh ${P})
endforeach()

dp_bad_input(stage01_unknown_device 2 "--device: tpu not in" ${S01} --device tpu)
if(DP_HAVE_NCCL)
  dp_bad_input(stage01_nccl_on_cpu_tensors 2 "NCCL moves CUDA tensors only" ${S01} --backend nccl --device cpu)
endif()
dp_bad_input(stage01_size_unit 2 "unknown unit 'xb'" ${S01} --bench --sizes 1MB,10XB)
dp_bad_input(stage01_size_not_whole_floats 2 "size .6B. is 6 bytes, not a whole number of 4-byte floats.*e.g. 8B" ${S01} --bench --sizes 1MB,6B)
dp_bad_input(stage01_rings_without_net 2 "--rings predicts times on a link of known rate.*--net 1gbit" ${S01} --bench --rings)
dp_bad_input(stage01_zero_iters 2 "positive" ${S01} --bench --iters 0)
dp_bad_input(stage01_negative_warmup 2 "warmup" ${S01} --bench --warmup -1)
dp_bad_input(stage01_bad_budget 2 "--budget.*5h" ${S01} --bench --budget 5h)
# A size no rank here can hold is refused before the demo (MEM: a 24 GB machine), not failed in an allocation.
dp_bad_input(stage01_size_does_not_fit 2 "--sizes 100 GB needs about 110.4 GB per rank.*use smaller --sizes"
  ${MEM} ${S01} --bench --sizes 1MB,100GB)
foreach(prog stage02_naive_ddp stage03_flat stage04_overlap stage05_bucketed stage06_sharded_opt stage07_fsdp
             ext05d_feature_bench)
  set(P $<TARGET_FILE:${prog}>)
  dp_bad_input(${prog}_zero_steps 2 "steps" ${P} --bench --steps 0)
  dp_bad_input(${prog}_negative_batch 2 "batch" ${P} --bench --batch -4)
  dp_bad_input(${prog}_unknown_preset 2 "huge" ${P} --bench --preset huge)
  # --trace records the benchmark's timed steps: without --bench, or to a folder that does not exist,
  # it is refused before any work.
  dp_bad_input(${prog}_trace_without_bench 2 "--trace requires --bench" ${P} --trace /tmp/dp_trace.json)
  dp_bad_input(${prog}_trace_unwritable 2 "cannot write there" ${P} ${TINY} --trace /nonexistent-dir/t.json)
endforeach()
# A budget that cuts the timed steps is said in the output, never silent. (Stage 05 with one row of its
# own: its eight rows trained in turn took 30 s and say nothing more about the budget.)
set(BUDGET_CUT --bench --preset nano --context 16 --warmup 0 --steps 3 --budget 1ms)
dp_bad_input(stage02_naive_ddp_budget_cut_is_said 0 "--budget 1ms reached after 1 of 3 timed steps"
  $<TARGET_FILE:stage02_naive_ddp> ${BUDGET_CUT})
dp_bad_input(stage05_bucketed_budget_cut_is_said 0 "--budget 1ms reached after 1 of 3 timed steps"
  $<TARGET_FILE:stage05_bucketed> ${BUDGET_CUT} --variants bucketed --caps 1)
foreach(prog stage02_naive_ddp stage03_flat stage04_overlap stage05_bucketed stage06_sharded_opt stage07_fsdp)  # global batch split over ranks
  dp_bad_input(${prog}_batch_not_divisible 2 "cannot be split" ${LAUNCH} --nproc 2 -- $<TARGET_FILE:${prog}> --bench --batch 3)
  # Checked before any rank connects: rank 1 alone, its rendezvous unreachable, gets the refusal at once.
  # (Checked after the group formed, a peer that had already exited 2 turned it into a connection error.)
  dp_bad_input(${prog}_batch_checked_before_rendezvous 2 "\\[rank 1/2\\] error: --batch 3 cannot be split"
    env RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=9 $<TARGET_FILE:${prog}> --bench --batch 3 --timeout 2s)
endforeach()
set(ALONE env RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=9)  # rank 1, its rendezvous unreachable
dp_bad_input(stage08_batch_checked_before_rendezvous 2 "\\[rank 1/2\\] error: --batch 15 is not a positive multiple"
  ${ALONE} $<TARGET_FILE:stage08_train_lm> --batch 15 --timeout 2s)
dp_bad_input(stage02_world_size_checked_before_rendezvous 2 "\\[rank 1/3\\] error: .*world size 3 does not divide 20"
  env RANK=1 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=9 ${S02} --timeout 2s)
# A benchmark's option without --bench is refused, not ignored (the checks alone would run and pass).
dp_bad_input(stage05_preset_without_bench 2 "--preset requires --bench" $<TARGET_FILE:stage05_bucketed> --preset small)
dp_bad_input(stage01_sizes_without_bench 2 "--sizes requires --bench" ${S01} --sizes 1MB)
dp_bad_input(stage07_dtype_without_bench 2 "--compute-dtype requires --bench" $<TARGET_FILE:stage07_fsdp> --compute-dtype bf16)
dp_bad_input(stage05_zero_cap 2 "caps" $<TARGET_FILE:stage05_bucketed> --bench --caps 0)
dp_bad_input(stage05_unknown_variant 2 "--variants: zero1 not in .naive,flat,overlap,bucketed."
  $<TARGET_FILE:stage05_bucketed> --bench --variants bucketed,zero1)
# Whole replicas of the 970 M-parameter `large` preset (about 16 B per parameter on every rank, plus the
# benchmark's second replica) do not fit a machine of this project's kind: refused up front, pointing at
# FSDP (stage 07), instead of being killed by the kernel. Stage 07 refuses what does not fit even sharded.
foreach(prog stage02_naive_ddp stage03_flat stage04_overlap stage05_bucketed stage06_sharded_opt)
  dp_bad_input(${prog}_large_does_not_fit 2 "--preset large .* needs about .* GB per rank.*FSDP, stage 07"
    ${MEM} ${LAUNCH} --nproc 2 -- $<TARGET_FILE:${prog}> --bench --preset large)
endforeach()
# A context whose activations (attention scores: batch x heads x context^2 values a layer) no rank can hold.
dp_bad_input(stage03_context_does_not_fit 2 "--preset tiny .* with --context 100000 and --batch [0-9]+ needs about .* GB per rank.*smaller --preset, --context or --batch"
  ${MEM} $<TARGET_FILE:stage03_flat> --bench --preset tiny --context 100000)
# Stage 07's benchmark trains FSDP beside a whole no-communication replica: `large` is refused as above,
# pointing at extension 07a, which builds each way of training alone and refuses what does not fit even sharded.
dp_bad_input(stage07_large_points_at_ext07a 2 "--preset large .* needs about .* GB per rank.*ext07a_fsdp_bench"
  ${MEM} ${LAUNCH} --nproc 2 -- $<TARGET_FILE:stage07_fsdp> --bench --preset large)
set(E7 $<TARGET_FILE:ext07a_fsdp_bench>)
dp_bad_input(ext07a_too_large_even_sharded 2 "FSDP .fsdp. needs about .* GB per rank.*more ranks"
  ${MEM} ${E7} --preset 2.7b --variants fsdp --reshard-after-forward true)
# `large` in bf16 on one rank needs about 22.8 GB: it fits in 24 GB, but not with a tenth to spare, and
# the variants train only with that spare. Nothing left to measure is refused, not a PASS with an empty table.
dp_bad_input(ext07a_no_variant_with_spare 2 "no variant of --variants fits in this machine with a tenth of it to spare.*: use more ranks .more machines. or a smaller --preset$"
  ${MEM} ${E7} --preset large --context 256 --batch 8 --variants fsdp --reshard-after-forward true --compute-dtype bf16)
dp_bad_input(memory_stand_in_not_a_number 2 "DP_AVAILABLE_MEMORY_BYTES=24GB: not a whole number of bytes"
  env DP_AVAILABLE_MEMORY_BYTES=24GB ${E7} --preset nano)
dp_bad_input(stage07_unknown_compute_dtype 2 "unknown compute dtype 'float16'.*bfloat16"
  $<TARGET_FILE:stage07_fsdp> --bench --compute-dtype float16)
dp_bad_input(ext07a_unknown_compute_dtype 2 "unknown compute dtype 'float16'.*bfloat16" ${E7} --compute-dtype float16)
dp_bad_input(stage07_reshard_misspelt 2 "--reshard-after-forward.*yes" $<TARGET_FILE:stage07_fsdp> --reshard-after-forward yes)
dp_bad_input(ext07a_unknown_variant 2 "--variants.*zero2" ${E7} --variants ddp,zero2)
dp_bad_input(ext07a_compute_dtype_without_fsdp 2 "--compute-dtype bf16 is the dtype of FSDP's gathered weights, and --variants ddp,zero1 has no fsdp"
  ${E7} --variants ddp,zero1 --compute-dtype bf16)
dp_bad_input(ext07a_zero_steps 2 "steps" ${E7} --steps 0)
dp_bad_input(ext07a_unknown_preset 2 "huge" ${E7} --preset huge)
dp_bad_input(ext07a_batch_not_divisible 2 "cannot be split" ${LAUNCH} --nproc 2 -- ${E7} --batch 3)
# A world size the CS336 check cannot split 20 rows over.
dp_bad_input(stage02_world_size_3 2 "does not divide" ${LAUNCH} --nproc 3 -- ${S02})

# GLOO_SOCKET_IFNAME naming no interface of this machine: exit 2 naming the value and the interfaces there,
# before Gloo's own enforce failure; the launcher passes the code on.
dp_add_test(bad_input_gloo_socket_ifname LABELS "hardening;cli" TIMEOUT 60 COMMAND
  env GLOO_SOCKET_IFNAME=dp_no_such_if0 ${EXPECT} 2 "GLOO_SOCKET_IFNAME=dp_no_such_if0: no such network interface here .this machine has: .*lo"
  -- ${LAUNCH} --nproc 2 -- ${S01})
# A rank started alone (its peer never comes): it fails after --timeout, tagged with its own rank.
dp_add_test(hardening_missing_peer LABELS "hardening;e2e" TIMEOUT 60 COMMAND
  env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1
  ${EXPECT} 2 "\\[rank 1/2\\] error: rank 1: rendezvous at 127.0.0.1:1 failed within 2 s" -- ${S01} --timeout 2s)
# A rank that hangs inside a collective: its peer fails after --timeout, naming the collective.
dp_add_test(hardening_hung_rank LABELS "hardening;e2e" TIMEOUT 60 COMMAND
  env DP_FAULT=hang@1 ${EXPECT} 1 "all_gather of [0-9]+ bytes failed" -- ${LAUNCH} --nproc 2 -- ${S01} --timeout 3s)
# Collectives in different orders (DP_FAULT=misorder@1: rank 1 issues one extra broadcast): plain Gloo pairs
# rank 1's broadcast with rank 0's all_gather and both wait out --timeout; under TORCH_DISTRIBUTED_DEBUG=DETAIL
# c10d's ProcessGroupWrapper names both collectives at once, in the words of whichever rank reports first (rank 0:
# "Rank 0 is running ALLGATHER, but Rank 1 is running BROADCAST"; rank 1 the other way round; LibTorch 2.x puts a
# SequenceNumber before the OpType). An unknown debug level is bad input.
dp_add_test(hardening_misorder_times_out LABELS "hardening;e2e" TIMEOUT 60 COMMAND
  env DP_FAULT=misorder@1 ${EXPECT} 1 "(broadcast|all_gather) of 32 bytes failed: .* hint \\[collective-timeout\\]"
  -- ${LAUNCH} --nproc 2 -- ${S01} --timeout 3s)
# One collective, two sizes (DP_FAULT=missize@1): Gloo aborts the rank that receives more than it expects, and
# the launcher names the mistake from Gloo's words (the workbook's hint [collective-mismatch]).
dp_add_test(hardening_missize_named LABELS "hardening;e2e" TIMEOUT 60 COMMAND
  env DP_FAULT=missize@1 ${EXPECT} "134|1" "ddp_launch: hint \\[collective-mismatch\\]: Gloo received more bytes"
  -- ${LAUNCH} --nproc 2 -- ${S01} --timeout 5s)
dp_add_test(hardening_misorder_detail LABELS "hardening;e2e" TIMEOUT 60 COMMAND
  env DP_FAULT=misorder@1 TORCH_DISTRIBUTED_DEBUG=DETAIL
  ${EXPECT} 1 "Detected mismatch between collectives on ranks. Rank (1 is running collective: CollectiveFingerPrint[(](SequenceNumber=[0-9]+, )?OpType=BROADCAST.*but Rank 0 is running collective: CollectiveFingerPrint[(](SequenceNumber=[0-9]+, )?OpType=ALLGATHER|0 is running collective: CollectiveFingerPrint[(](SequenceNumber=[0-9]+, )?OpType=ALLGATHER.*but Rank 1 is running collective: CollectiveFingerPrint[(](SequenceNumber=[0-9]+, )?OpType=BROADCAST)"
  -- ${LAUNCH} --nproc 2 -- ${S01} --timeout 30s)
dp_bad_input(torch_distributed_debug_unknown 2 "TORCH_DISTRIBUTED_DEBUG=LOUD: not a level c10d knows. use OFF, INFO or DETAIL"
  env TORCH_DISTRIBUTED_DEBUG=LOUD ${S01})
# A rank that dies mid-training ends the run within seconds.
dp_add_test(hardening_dead_rank LABELS "hardening;e2e" TIMEOUT 60 COMMAND
  env DP_FAULT=die@1 ${EXPECT} "1|137" "rank 1 was killed by signal 9|rank 0 exited with code 1" --
  ${LAUNCH} --nproc 2 -- ${S02} ${TINY})

# Stage 08: options that cannot work together, a corpus or checkpoint that is not there.
set(S08 $<TARGET_FILE:stage08_train_lm>)
dp_bad_input(stage08_resume_without_checkpoint 2 "--resume need --checkpoint FILE" ${S08} --resume)
dp_bad_input(stage08_resume_missing_file 2 "checkpoint /nonexistent/lm.ckpt does not exist"
  ${S08} --resume --checkpoint /nonexistent/lm.ckpt)
dp_bad_input(stage08_unknown_sync 2 "--sync" ${S08} --sync zero3)
dp_bad_input(stage08_hsdp_needs_ext10a 2 "--sync: hsdp not in" ${S08} --sync hsdp)  # stage 08 links no stage 10
dp_bad_input(stage08_clip_grad_norm_negative 2 "--clip-grad-norm: '-1'" ${S08} --clip-grad-norm -1)
# Extension 10a: HSDP's node count must divide the world, checked before the group forms (rank 1 alone, its
# rendezvous unreachable, gets the refusal at once).
set(E10A $<TARGET_FILE:ext10a_train_lm>)
dp_bad_input(ext10a_nodes_do_not_divide 2
  "\\[rank 1/3\\] error: --sync hsdp over 2 nodes: 3 ranks do not split into equal nodes; give --nodes a divisor of 3"
  env RANK=1 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=9 ${E10A} --sync hsdp --nodes 2 --batch 12 --timeout 2s)
dp_bad_input(stage08_bucket_mb_without_ddp 2 "--bucket-mb sets DDP's buckets. --sync fsdp has none" ${S08} --sync fsdp --bucket-mb 5)
dp_bad_input(stage08_missing_corpus 2 "--corpus /nonexistent: no such file or directory.*apt-get install fortunes"
  ${S08} --corpus /nonexistent)
# A text too short for the run (README.md, 25 kB, against 2 x 30001 bytes) is refused before any work, naming
# what would help; a held-out part shorter than one window is Corpus.EveryTwentiethBlockIsHeldOut's case.
dp_bad_input(stage08_corpus_folder_of_folders 2 "--corpus /proc/sys: no regular file directly in this folder"
  ${S08} --corpus /proc/sys --steps 1 --warmup 0)  # subfolders only: said so, not "too little text"
dp_bad_input(stage08_corpus_device 2 "--corpus /dev/zero is neither a regular file nor a folder"
  ${S08} --corpus /dev/zero --steps 1 --warmup 0)  # it would be read until memory runs out
dp_bad_input(stage08_corpus_too_small 2 "too little for --batch 1 and --context 30000.*a larger --corpus, or a smaller"
  ${S08} --corpus ${CMAKE_SOURCE_DIR}/README.md --batch 1 --context 30000)
dp_bad_input(stage08_batch_not_divisible 2 "--batch 15 is not a positive multiple of the world size 2"
  ${LAUNCH} --nproc 2 -- ${S08} --batch 15)

# Numbers: nan, inf and out-of-range values are refused with the rule in words (not CLI11's 308-digit range).
set(S08 $<TARGET_FILE:stage08_train_lm>)
dp_bad_input(stage08_lr_nan 2 "--lr: 'nan': the value must be a finite number > 0" ${S08} --lr nan)
dp_bad_input(stage08_lr_inf 2 "--lr: 'inf': the value must be a finite number > 0" ${S08} --lr inf)
dp_bad_input(stage08_lr_negative 2 "--lr: '-1': the value must be a finite number > 0" ${S08} --lr -1)
dp_bad_input(stage08_lr_not_a_number 2 "--lr: 'fast' is not a number: it must be a finite number > 0" ${S08} --lr fast)
dp_bad_input(stage08_bucket_mb_zero 2 "--bucket-mb: '0': the value must be a finite number > 0" ${S08} --bucket-mb 0)
dp_bad_input(stage05_caps_nan 2 "--caps: 'nan': the value must be a finite number > 0" $<TARGET_FILE:stage05_bucketed> --bench --caps 1,nan)
dp_bad_input(stage02_seed_negative 2 "--seed: '-1': the value must be a finite number >= 0" ${S02} --seed -1)
dp_bad_input(stage01_warmup_inf 2 "--warmup: 'inf': the value must be a finite number >= 0" ${S01} --bench --warmup inf)
dp_bad_input(stage08_warmup_past_steps 2 "--warmup 20 is longer than --steps 2: .* give --warmup 2 or less" ${S08} --steps 2)
# Output files of stage 08 (checkpoint, curve) and stage 06 (its checkpoint folder), checked before any work.
dp_bad_input(stage08_checkpoint_unwritable 2 "--checkpoint /nonexistent-dir/lm.ckpt: cannot write there"
  ${S08} --checkpoint /nonexistent-dir/lm.ckpt)
dp_bad_input(stage08_curve_unwritable 2 "--curve /nonexistent-dir/c.json: cannot write there" ${S08} --curve /nonexistent-dir/c.json)
# The folder exists and access(2) says yes to root, but no file can be made there: tried, not asked (it used to
# fail at the first save). A device or a link is refused: the output is renamed over the path, which would replace it.
dp_bad_input(stage08_checkpoint_in_proc 2 "--checkpoint /proc/lm.ckpt: cannot write there: creating a file in /proc failed"
  ${S08} --checkpoint /proc/lm.ckpt)
dp_bad_input(stage01_json_device 2 "--json /dev/null: cannot write there: it exists and is not a regular file"
  ${S01} --json /dev/null)
dp_bad_input(stage01_json_symlink 2 "--json /dev/stdout: cannot write there: it is a symbolic link" ${S01} --json /dev/stdout)
# A model this machine cannot hold is refused before the rendezvous (rank 1 alone, as above): whole replicas of
# `large` (20 B per parameter with the buckets) on two ranks of a 24 GB machine, pointing at FSDP; a context whose
# attention scores alone need terabytes.
dp_bad_input(stage08_large_does_not_fit 2 "\\[rank 1/2\\] error: --sync ddp --preset large .* needs about [0-9.]+ GB per rank.*--sync fsdp"
  ${MEM} ${ALONE} LOCAL_WORLD_SIZE=2 ${S08} --preset large --timeout 2s)
# FSDP holds `large` in 16 bytes a parameter / 2 ranks, but a checkpoint gathers its whole state on every rank.
dp_bad_input(stage08_checkpoint_does_not_fit 2 "--sync fsdp --preset large .* needs about [0-9.]+ GB per rank.*no --checkpoint .it gathers the whole state., or more machines"
  ${MEM} ${ALONE} LOCAL_WORLD_SIZE=2 ${S08} --preset large --sync fsdp --checkpoint /tmp/dp_bad_input_large.ckpt --timeout 2s)
dp_bad_input(stage08_context_does_not_fit 2 "--context 20000 with micro-batches of 16 sequences needs about [0-9.]+ GB per rank"
  ${MEM} ${S08} --context 20000 --batch 16)


# Stage 09: what cannot be elastic, and memberships the global batch does not split into, are refused before
# any work; so is a run outside ddp_launch --elastic and a malformed DP_FAULT.
set(S09 $<TARGET_FILE:stage09_elastic>)
set(ELASTIC_ENV env RANK=0 WORLD_SIZE=3 LOCAL_WORLD_SIZE=3 DP_ELASTIC_STORE=/tmp/dp_bad_input_elastic_store)
dp_bad_input(stage09_zero1_refused 2 "--sync zero1: elastic training needs every rank to hold the whole model.*HSDP.*checkpoint"
  ${S09} --sync zero1)
dp_bad_input(stage09_fsdp_refused 2 "--sync fsdp: .*with FSDP a dead rank's shard dies with it" ${S09} --sync fsdp)
dp_bad_input(stage09_hsdp_refused 2
  "--sync hsdp: an elastic run loses and gains single ranks, and HSDP's mesh needs whole nodes.*ext10a_train_lm --sync hsdp and resume from its checkpoint"
  ${S09} --sync hsdp)
dp_bad_input(stage09_batch_not_split 2 "--batch 10 does not split evenly over every membership from 1 to 3 ranks .*use a multiple of 6"
  ${ELASTIC_ENV} ${S09} --batch 10)
# Whole replicas of `large` for the 3 ranks started on this machine (stage 09 trains with DDP only).
dp_bad_input(stage09_large_does_not_fit 2 "--sync ddp --preset large .* GB per rank, .* for the 3 rank.s. on this machine"
  ${MEM} ${ELASTIC_ENV} ${S09} --preset large)
# Periodic checkpoints (the fallback when every holder dies): an interval needs a file, is 1 or more, and the
# file's folder must exist before any training.
dp_bad_input(stage09_checkpoint_every_without_file 2 "--checkpoint-every and --resume need --checkpoint FILE"
  ${ELASTIC_ENV} ${S09} --checkpoint-every 5)
dp_bad_input(stage09_checkpoint_every_zero 2 "--checkpoint-every: '0' must be a positive integer" ${S09} --checkpoint-every 0)
dp_bad_input(stage09_checkpoint_every_negative 2 "--checkpoint-every: '-3' must be a positive integer"
  ${S09} --checkpoint-every -3)
dp_bad_input(stage09_checkpoint_unwritable 2 "--checkpoint /proc/nope/a.ckpt: cannot write there.*mkdir -p /proc/nope"
  ${ELASTIC_ENV} ${S09} --checkpoint /proc/nope/a.ckpt --checkpoint-every 5)
dp_bad_input(stage09_min_ranks_above_started 2 "--min-ranks 4 is above the 3 ranks started" ${ELASTIC_ENV} ${S09} --min-ranks 4)
dp_bad_input(stage09_not_elastic 2 "DP_ELASTIC_STORE is unset.*ddp_launch --elastic" env RANK=0 WORLD_SIZE=2 ${S09})
dp_bad_input(stage09_bad_fault 2 "DP_FAULT entry 'explode@1:step3' is not ACTION@SLOT:POINT" env DP_FAULT=explode@1:step3 ${S09})
dp_bad_input(stage09_unknown_option 2 "--no-such-option" ${S09} --no-such-option)
dp_bad_input(stage09_help 0 "Options" ${S09} --help)
dp_bad_input(launcher_elastic_min_above_nproc 2 "--min-nproc must be 1..2, got '3'"
  $<TARGET_FILE:ddp_launch> --elastic --nproc 2 --min-nproc 3 -- ${S09})
dp_bad_input(launcher_elastic_negative_restarts 2 "--max-restarts must be 0..1000, got '-1'"
  $<TARGET_FILE:ddp_launch> --elastic --max-restarts -1 -- ${S09})
