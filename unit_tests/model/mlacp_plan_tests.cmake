# mlacp-plan as users run it (included from unit_tests/CMakeLists.txt). Plan mode needs no launcher: those tests run
# the tool directly, on the hand-written machine file data/two_node_cpu.json; calibration runs under MPIEXEC at 2 ranks
# and its file is then planned with.
set(_mlacp_plan_machine ${CMAKE_CURRENT_SOURCE_DIR}/model/data/two_node_cpu.json)
# A small DeepSeek-like layer that 2 nodes x 4 ranks can run every way.
set(_mlacp_plan_layer
    --batch
    1
    --seq
    4096
    --hidden
    1024
    --heads
    16
    --nope
    64
    --rope
    32
    --vdim
    64
    --latent
    256)

# mlacp_add_plan_test(<name> EXIT <status> EXPECT <regex>... [REJECT <regex>...] ARGS <arg>...): mlacp-plan <args>
# without a launcher, through MlacpExpectOutput.cmake (exactly that exit status, every pattern matching the output).
function(mlacp_add_plan_test name)
  cmake_parse_arguments(arg "" "EXIT" "EXPECT;REJECT;ARGS" ${ARGN})
  set(command $<TARGET_FILE:mlacp-plan> ${arg_ARGS})
  string(REPLACE ";" "|" command "${command}")
  string(REPLACE ";" "|" expect "${arg_EXPECT}")
  string(REPLACE ";" "|" reject "${arg_REJECT}")
  add_test(NAME ${name} COMMAND ${CMAKE_COMMAND} "-DCOMMAND=${command}" -DEXPECT_EXIT=${arg_EXIT} "-DEXPECT=${expect}"
                                "-DREJECT=${reject}" -P ${PROJECT_SOURCE_DIR}/cmake/MlacpExpectOutput.cmake)
  set_tests_properties(${name} PROPERTIES TIMEOUT 60 LABELS "plan" ENVIRONMENT "${MLACP_TEST_ENVIRONMENT}")
endfunction()

# A plan on the machine file: the table, the recommendation, the JSON, exit 0.
mlacp_add_plan_test(
  plan_two_node_cpu
  EXIT 0
  EXPECT "recommendation: [a-z]+ U=[0-9]+ C=[0-9]+.*: predicted [0-9.]+ m?s per forward \\+ backward"
         "  14  [a-z]+ U=[0-9] C=[0-9]" "wrote .*plan_two_node_cpu.json"
  ARGS ${_mlacp_plan_layer} --dtype float --nodes 2 --ranks-per-node 4 --memory-per-rank 16GiB --machine
       ${_mlacp_plan_machine} --json ${CMAKE_CURRENT_BINARY_DIR}/plan_two_node_cpu.json)
# Restricted to one strategy, rings of 2, the contiguous layout, bf16 with a low-rank query and packed documents.
mlacp_add_plan_test(
  plan_two_node_cpu_restricted
  EXIT 0
  EXPECT "recommendation: latent U=4 C=2 contiguous: predicted" "R=256 Rq=384 bias=no" "documents=2 wire=same ring_layout=zigzag dtype=bf16"
  REJECT "  2   [a-z]+ U=" "expanded U=" "C=[0-9] zigzag"
  ARGS ${_mlacp_plan_layer} --q-lora 384 --cu-seqlens 0,1000,4096 --dtype bf16 --nodes 2 --ranks-per-node 4 --strategy
       latent --ring 2 --layout contiguous --machine ${_mlacp_plan_machine})
# Nothing fits 1 MiB per rank: exit 1, naming the smallest requirement and the budget.
mlacp_add_plan_test(
  plan_memory_budget_fails
  EXIT 1
  EXPECT "no choice fits the memory budget: the smallest, .*, needs [0-9.]+ [KMGT]?i?B per rank"
         "the budget is 1 MiB per rank"
  ARGS ${_mlacp_plan_layer} --dtype float --nodes 2 --ranks-per-node 4 --memory-per-rank 1MiB --machine
       ${_mlacp_plan_machine})
# Bad usage: exit 2, the flag and the value named, the usage text.
mlacp_add_plan_test(
  plan_bad_dtype
  EXIT 2
  EXPECT "mlacp-plan: --dtype half: .*half" "usage: mlacp-plan"
  ARGS ${_mlacp_plan_layer} --dtype half --nodes 2 --ranks-per-node 4 --machine ${_mlacp_plan_machine})
mlacp_add_plan_test(
  plan_wire_on_a_double_layer
  EXIT 2
  EXPECT "mlacp-plan: --wire-dtype bf16 with --dtype double: expected --dtype float" "usage: mlacp-plan"
  ARGS ${_mlacp_plan_layer} --dtype double --wire-dtype bf16 --nodes 2 --ranks-per-node 4 --machine
       ${_mlacp_plan_machine})
mlacp_add_plan_test(
  plan_bad_wire
  EXIT 2
  EXPECT "mlacp-plan: --wire-dtype fp16: .*fp16" "usage: mlacp-plan"
  ARGS ${_mlacp_plan_layer} --dtype float --wire-dtype fp16 --nodes 2 --ranks-per-node 4 --machine
       ${_mlacp_plan_machine})
mlacp_add_plan_test(
  plan_bad_memory
  EXIT 2
  EXPECT "mlacp-plan: --memory-per-rank 80parsecs: expected a byte count" "usage: mlacp-plan"
  ARGS ${_mlacp_plan_layer} --dtype float --nodes 2 --ranks-per-node 4 --memory-per-rank 80parsecs --machine
       ${_mlacp_plan_machine})
mlacp_add_plan_test(
  plan_bad_integer
  EXIT 2
  EXPECT "mlacp-plan: --heads sixteen: expected an integer" "usage: mlacp-plan"
  ARGS ${_mlacp_plan_layer} --heads sixteen --dtype float --nodes 2 --ranks-per-node 4 --machine ${_mlacp_plan_machine})
# Every MlaConfig field is a flag, from the configuration table (src/tools/config_flags.hpp), as mlacp-mla-block's.
mlacp_add_plan_test(
  plan_table_flags
  EXIT 0
  EXPECT "rope_base=5000 .*overlap=no" "recommendation: "
  ARGS ${_mlacp_plan_layer} --rope-base 5000 --no-overlap --q-lora-rank 384 --dtype float --nodes 2 --ranks-per-node 4
       --machine ${_mlacp_plan_machine})
mlacp_add_plan_test(
  plan_table_flag_bad_value
  EXIT 2
  EXPECT "mlacp-plan: --max-documents many: expected an integer" "usage: mlacp-plan"
  ARGS ${_mlacp_plan_layer} --max-documents many --dtype float --nodes 2 --ranks-per-node 4 --machine
       ${_mlacp_plan_machine})
mlacp_add_plan_test(
  plan_unknown_flag
  EXIT 2
  EXPECT "mlacp-plan: unknown flag --frobnicate" "usage: mlacp-plan"
  ARGS ${_mlacp_plan_layer} --frobnicate 3 --dtype float --nodes 2 --ranks-per-node 4 --machine ${_mlacp_plan_machine})
mlacp_add_plan_test(
  plan_missing_machine
  EXIT 2
  EXPECT "mlacp-plan: missing --machine" "usage: mlacp-plan"
  ARGS ${_mlacp_plan_layer} --dtype float --nodes 2 --ranks-per-node 4)
mlacp_add_plan_test(
  plan_unreadable_machine
  EXIT 2
  EXPECT "mlacp-plan: .*/nonexistent/machine.json"
  ARGS ${_mlacp_plan_layer} --dtype float --nodes 2 --ranks-per-node 4 --machine /nonexistent/machine.json)

# Calibration at 2 ranks (quick), then a plan on the file it wrote.
set(_mlacp_plan_calibrated ${CMAKE_CURRENT_BINARY_DIR}/plan_calibrated_np2.json)
add_test(NAME plan_calibrated_clean COMMAND ${CMAKE_COMMAND} -E rm -f ${_mlacp_plan_calibrated})
set_tests_properties(plan_calibrated_clean PROPERTIES FIXTURES_SETUP plan_calibrated LABELS "plan")
mlacp_add_expect_output_test(
  plan_calibrate_quick_np2
  RANKS 2
  COMMAND $<TARGET_FILE:mlacp-plan> --calibrate --quick --out ${_mlacp_plan_calibrated}
  EXPECT_EXIT zero
  TIMEOUT 600
  LABELS plan
  EXPECT "mlacp-plan --calibrate on 2 ranks" "intra-node: alpha [0-9.]+ us, beta .*GB/s" "GEMM float \\(effective size"
         "attention float: forward" "calibration took [0-9.]+ s" "wrote .*plan_calibrated_np2.json")
set_tests_properties(plan_calibrate_quick_np2 PROPERTIES FIXTURES_SETUP plan_calibrated DEPENDS plan_calibrated_clean)
mlacp_add_plan_test(
  plan_on_calibrated
  EXIT 0
  EXPECT "recommendation: [a-z]+ U=[0-9]+ C=[0-9]+"
  ARGS --batch 1 --seq 256 --hidden 64 --heads 4 --nope 16 --rope 8 --vdim 16 --latent 32 --dtype float --nodes 1
       --ranks-per-node 2 --machine ${_mlacp_plan_calibrated})
set_tests_properties(plan_on_calibrated PROPERTIES FIXTURES_REQUIRED plan_calibrated)
# An option calibrate refuses ends every rank with the message, exit 2.
mlacp_add_expect_output_test(
  plan_calibrate_bad_repeats_np2
  RANKS 2
  COMMAND $<TARGET_FILE:mlacp-plan> --calibrate --quick --repeats 0 --out ${CMAKE_CURRENT_BINARY_DIR}/unused.json
  EXPECT_EXIT 2
  TIMEOUT 60
  LABELS plan
  EXPECT "rank 0: .*repeats = 0" "rank 1: .*repeats = 0")
