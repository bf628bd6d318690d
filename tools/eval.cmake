# Evaluation tools (issue 6): the position-matched sweep plan, the per-residue report, the
# idealized retrieval sweep, and the demo target.
phasekv_add_tool(phasekv-report SOURCES report.cpp LIBRARIES nlohmann_json::nlohmann_json)
phasekv_add_tool(phasekv-plan SOURCES plan.cpp LIBRARIES nlohmann_json::nlohmann_json)
