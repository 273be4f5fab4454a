# Stage 10 end to end (through the launcher) and its bad inputs. Its GoogleTest suites are test_stage10 and HSDP's
# share of test_strategy_contract (tests/stages/CMakeLists.txt).
set(S10 $<TARGET_FILE:stage10_hierarchy>)
# The hierarchical all-reduce (against the flat one, its bytes per tier against the formula, as stage 05's
# communication hook), HSDP (its accumulation flavours) and gradient-norm clipping for DDP, ZeRO-1, FSDP and HSDP (its
# two classic mistakes caught by name; extension 05c's overlapped optimizer refusing it), on 2-D meshes of ranks as
# threads.
dp_add_gtest(test_stage10 SOURCES test_hier_allreduce.cpp test_hsdp.cpp test_clip.cpp LINK stage10_lib ext05_lib
  dp_test_support LABELS "stage10;dist" TIMEOUT 240)
# 2 nodes x 2 ranks over loopback: the checks, then the benchmark's four rows for one step (the tour's row).
dp_add_test(stage10_e2e LABELS "stage10;e2e" TIMEOUT 240 COST 10
  COMMAND ${EXPECT} 0 "PASS stage 10: .* \\(2 nodes x 2 ranks\\)" -- ${LAUNCH} --nproc 4 --
          ${S10} --nodes 2 --tier-mb 1 --bench --preset nano --context 16 --warmup 0 --steps 1
          --json ${TOUR_E2E}/stage10.json)
# 2 nodes of one rank: no node group to reduce-scatter in; HSDP is pure replication, the hierarchy a flat all-reduce.
dp_add_test(stage10_e2e_2x1 LABELS "stage10;e2e" TIMEOUT 120
  COMMAND ${EXPECT} 0 "PASS stage 10: .* \\(2 nodes x 1 rank\\)" -- ${LAUNCH} --nproc 2 -- ${S10} --nodes 2 --tier-mb 1)
# On the simulated two-tier cluster (root and iproute2, or skipped): the nodes come from the launcher, and each tier
# is measured against its own link.
dp_add_test(stage10_net_2x2 LABELS "stage10;net" TIMEOUT 180 RUN_SERIAL
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/../net_or_skip.sh ${EXPECT} 0 "across nodes: 2 ranks, .* of the 1gbit link" --
          ${LAUNCH} --nproc 4 --net 10gbit --net-nodes 2 --net-uplink 1gbit -- ${S10} --tier-mb 4)
set_tests_properties(stage10_net_2x2 PROPERTIES SKIP_RETURN_CODE 77 RESOURCE_LOCK dpnet)

set(ALONE10 env RANK=1 WORLD_SIZE=4 LOCAL_WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=9)  # rendezvous unreachable
dp_bad_input(stage10_nodes_not_dividing 2 "\\[rank 1/4\\] error: --nodes = 3 does not divide the 4 ranks"
  ${ALONE10} ${S10} --nodes 3 --timeout 2s)
dp_bad_input(stage10_net_nodes_not_dividing 2 "ddp_launch --net-nodes.* = 3 does not divide the 4 ranks"
  ${ALONE10} DP_NET_NODES=3 ${S10} --timeout 2s)
dp_bad_input(stage10_nodes_zero 2 "--nodes: '0' must be a positive integer" ${S10} --nodes 0)
dp_bad_input(stage10_clip_negative 2 "--clip-grad-norm" ${S10} --bench --clip-grad-norm -1)
dp_bad_input(stage10_clip_without_bench 2 "--clip-grad-norm requires --bench" ${S10} --clip-grad-norm 1)
