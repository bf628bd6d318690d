# Evaluation tools (issue 6): the position-matched sweep plan, the per-residue report, the
# idealized retrieval sweep, and the demo target.
phasekv_add_tool(phasekv-report SOURCES report.cpp LIBRARIES nlohmann_json::nlohmann_json)
phasekv_add_tool(phasekv-plan SOURCES plan.cpp LIBRARIES nlohmann_json::nlohmann_json)
phasekv_add_tool(phasekv-sweep SOURCES sweep.cpp)

# The demo (`cmake --workflow --preset demo`): the per-phase weak spots of the idealized
# induction task (R2) under W = S = 8 (uniform pooling and a one-hot compressor) and under
# DeepSeek-V4-like W = 8, S = 4, printed as bar charts; the reports (JSON, CSV, Markdown, SVG
# plots) go to <build>/phasekv-demo/.
set(_demo_dir ${CMAKE_BINARY_DIR}/phasekv-demo)
set(_demo_common --task R2 --trials 320 --seed 1 --bars --quiet)
add_custom_target(phasekv_demo
  COMMAND ${CMAKE_COMMAND} -E make_directory ${_demo_dir}
  COMMAND ${CMAKE_COMMAND} -E echo ""
  COMMAND ${CMAKE_COMMAND} -E echo "== R2 induction, UniformMean, W=S=8 (boundary phase 7 is weak)"
  COMMAND phasekv-sweep ${_demo_common} --policy uniform -W 8 -S 8
          --json ${_demo_dir}/r2_uniform_w8s8.json --csv ${_demo_dir}/r2_uniform_w8s8.csv
          --markdown ${_demo_dir}/r2_uniform_w8s8.md --plot ${_demo_dir}/r2_uniform_w8s8.svg
  COMMAND ${CMAKE_COMMAND} -E echo ""
  COMMAND ${CMAKE_COMMAND} -E echo "== R2 induction, one-hot compressor (keys at offset 3, values at 4), W=S=8"
  COMMAND phasekv-sweep ${_demo_common} --policy select -W 8 -S 8 --offsets 3
          --json ${_demo_dir}/r2_onehot_w8s8.json --csv ${_demo_dir}/r2_onehot_w8s8.csv
          --markdown ${_demo_dir}/r2_onehot_w8s8.md --plot ${_demo_dir}/r2_onehot_w8s8.svg
  COMMAND ${CMAKE_COMMAND} -E echo ""
  COMMAND ${CMAKE_COMMAND} -E echo "== R2 induction, DeepSeek-V4-like W=8 S=4, UniformMean, measured mod 8"
  COMMAND phasekv-sweep ${_demo_common} --policy uniform -W 8 -S 4 --modulus 8
          --json ${_demo_dir}/r2_uniform_w8s4.json --csv ${_demo_dir}/r2_uniform_w8s4.csv
          --markdown ${_demo_dir}/r2_uniform_w8s4.md --plot ${_demo_dir}/r2_uniform_w8s4.svg
  COMMAND ${CMAKE_COMMAND} -E echo ""
  COMMAND ${CMAKE_COMMAND} -E echo "== R2 induction, W=8 S=4, gated pooling (bias 3 on key offset 1 / value offset 2, content gates N(0,1)), mod 8"
  COMMAND phasekv-sweep ${_demo_common} --policy gated -W 8 -S 4 --modulus 8 --offsets 1
          --sharpness 3 --content-scale 1
          --json ${_demo_dir}/r2_gated_w8s4.json --csv ${_demo_dir}/r2_gated_w8s4.csv
          --markdown ${_demo_dir}/r2_gated_w8s4.md --plot ${_demo_dir}/r2_gated_w8s4.svg
  COMMAND ${CMAKE_COMMAND} -E echo ""
  COMMAND ${CMAKE_COMMAND} -E echo "Reports (JSON, CSV, Markdown, SVG plots) written to ${_demo_dir}"
  DEPENDS phasekv-sweep
  USES_TERMINAL
  VERBATIM
  COMMENT "phasekv demo: periodic weak spots of chunked KV compression (idealized induction task)")
