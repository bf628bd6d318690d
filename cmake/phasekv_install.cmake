# Installs the headers, the exported target and a package config so that
#   find_package(phasekv CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE phasekv::phasekv)
# works from the install prefix.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/include/phasekv
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.hpp" PATTERN "*.cuh" PATTERN "*.inl" PATTERN "*.inc")
install(TARGETS phasekv EXPORT phasekvTargets)
install(EXPORT phasekvTargets
  NAMESPACE phasekv::
  DESTINATION ${CMAKE_INSTALL_DATADIR}/phasekv/cmake)

configure_package_config_file(
  ${CMAKE_CURRENT_SOURCE_DIR}/cmake/phasekvConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/phasekvConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_DATADIR}/phasekv/cmake)
# Header-only: the package is usable by any architecture.
write_basic_package_version_file(
  ${CMAKE_CURRENT_BINARY_DIR}/phasekvConfigVersion.cmake
  COMPATIBILITY SameMinorVersion
  ARCH_INDEPENDENT)
install(FILES
  ${CMAKE_CURRENT_BINARY_DIR}/phasekvConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/phasekvConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_DATADIR}/phasekv/cmake)
