# Where `cmake --install` (and the Debian package, cmake/package.cmake) puts
# pstrain, relative to the prefix:
#
#   lib/pstrain/pstrain              the binary; its CUDA library beside it, as
#   lib/pstrain/libpstrain_cuda.so   in the build tree (client/compute/cuda_loader.h)
#   lib/pstrain/bench/bench_*        what pstrain-bench runs: the C++ benchmarks
#                                    and their PyTorch peers, bench_torch.py,
#                                    bench_torch_embedding.py and bench_torch_ctr.py
#   lib/pstrain/tools/               launch, compare, bench, trace, netlab, report.py and the
#                                    package they run, pstrain_tools/
#   bin/pstrain, bin/pstrain-launch, bin/pstrain-compare, bin/pstrain-bench,
#   bin/pstrain-trace, bin/pstrain-netlab
#                                    links to the above
#   share/doc/pstrain/               README, CHANGELOG, LICENSE, docs/, and
#                                    examples/cluster.yaml (the default job) and
#                                    examples/ctr.yaml (the click-through job)
#
# Component `runtime` is everything but the CUDA library, component `cuda`.

include(GNUInstallDirs)
set(PSTRAIN_INSTALL_LIBDIR "lib/pstrain" CACHE STRING
    "pstrain's private folder under the install prefix (the binary, its CUDA library, the tools)")
set(CMAKE_INSTALL_DEFAULT_COMPONENT_NAME runtime)
set(PSTRAIN_INSTALL_TOOLS "${PSTRAIN_INSTALL_LIBDIR}/tools")
set(PSTRAIN_INSTALL_TOOLS_PACKAGE "${PSTRAIN_INSTALL_TOOLS}/pstrain_tools")
set(PSTRAIN_INSTALL_BENCH "${PSTRAIN_INSTALL_LIBDIR}/bench")  # bench/CMakeLists.txt

# The commands, each of which finds the package beside itself.
set(PSTRAIN_TOOL_PROGRAMS launch compare bench trace netlab)
foreach(tool IN LISTS PSTRAIN_TOOL_PROGRAMS)
  install(PROGRAMS tools/${tool} DESTINATION ${PSTRAIN_INSTALL_TOOLS})
endforeach()
install(PROGRAMS tools/report.py DESTINATION ${PSTRAIN_INSTALL_TOOLS})
# The package's sources, not the byte code that running it in the source
# tree leaves there.
install(DIRECTORY tools/pstrain_tools DESTINATION ${PSTRAIN_INSTALL_TOOLS}
        FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)

# The installed tools find the installed binary, example and Python
# benchmarks through this module (tools/pstrain_tools/paths.py); paths
# relative to the package's folder, so the tree works under any prefix
# (cmake --install --prefix, DESTDIR).
set(package_dir "${CMAKE_INSTALL_PREFIX}/${PSTRAIN_INSTALL_TOOLS_PACKAGE}")
file(RELATIVE_PATH binary_from_package "${package_dir}"
     "${CMAKE_INSTALL_PREFIX}/${PSTRAIN_INSTALL_LIBDIR}/pstrain")
file(RELATIVE_PATH example_from_package "${package_dir}"
     "${CMAKE_INSTALL_FULL_DOCDIR}/examples/cluster.yaml")
file(RELATIVE_PATH bench_from_package "${package_dir}"
     "${CMAKE_INSTALL_PREFIX}/${PSTRAIN_INSTALL_BENCH}")
file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/install/install_layout.py CONTENT
"\"\"\"Where cmake --install put what the tools use, relative to their package.\"\"\"

BINARY = \"${binary_from_package}\"
CLUSTER_EXAMPLE = \"${example_from_package}\"
BENCH = \"${bench_from_package}\"
")
install(FILES ${PROJECT_BINARY_DIR}/install/install_layout.py
        DESTINATION ${PSTRAIN_INSTALL_TOOLS_PACKAGE})

# bin/: relative links, made here and installed as links.
function(pstrain_install_link name target)
  file(RELATIVE_PATH relative "${CMAKE_INSTALL_FULL_BINDIR}"
       "${CMAKE_INSTALL_PREFIX}/${target}")
  file(MAKE_DIRECTORY ${PROJECT_BINARY_DIR}/install/bin)
  file(CREATE_LINK "${relative}" ${PROJECT_BINARY_DIR}/install/bin/${name} SYMBOLIC)
  install(FILES ${PROJECT_BINARY_DIR}/install/bin/${name} DESTINATION ${CMAKE_INSTALL_BINDIR})
endfunction()
pstrain_install_link(pstrain "${PSTRAIN_INSTALL_LIBDIR}/pstrain")
foreach(tool IN LISTS PSTRAIN_TOOL_PROGRAMS)
  pstrain_install_link(pstrain-${tool} "${PSTRAIN_INSTALL_TOOLS}/${tool}")
endforeach()

install(FILES README.md CHANGELOG.md LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs)
install(FILES cluster.yaml examples/ctr.yaml DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)
