# The Debian packages, built by CPack (tools/package):
#
#   pstrain       everything but the CUDA library. Depends: the shared
#                 libraries its programs link, as dpkg-shlibdeps finds them
#                 on the build host, and the Python packages the tools
#                 import. Recommends the data set of the default job.
#   pstrain-cuda  libpstrain_cuda.so, which a worker loads only for a GPU.
#                 Depends on pstrain alone: the CUDA runtime, cuBLAS and
#                 NCCL it links come from NVIDIA (the toolkit, or a CUDA
#                 base image), not from Debian packages, so a dependency
#                 on them could not be met by apt; the installed library
#                 looks for them in the toolkit's folder it was built
#                 against (its RUNPATH) and on the loader's path, and
#                 `pstrain --version` says whether it loads.
#
# The Containerfile installs exactly pstrain's Depends and Recommends
# (tests/tools/test_package.py keeps the two equal).

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME pstrain)
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_RESOURCE_FILE_LICENSE "${PROJECT_SOURCE_DIR}/LICENSE")
set(CPACK_STRIP_FILES ON)

set(PSTRAIN_PACKAGE_MAINTAINER "pstrain developers" CACHE STRING
    "The Maintainer field of the Debian packages (Name <email>)")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${PSTRAIN_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime)
if(PSTRAIN_CUDA)
  list(APPEND CPACK_COMPONENTS_ALL cuda)
endif()

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME pstrain)
# Each description's first line is its package's summary; an empty common
# summary keeps CPack from putting the project's above both.
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "")
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION "${PROJECT_DESCRIPTION}
Parameter servers hold the model's variables, sharded; workers pull weights,
compute gradients on the CPU (OpenBLAS) or a GPU (package pstrain-cuda) and
push them back over ZeroMQ, asynchronously or in sync, SSP, backup-worker
and local-SGD modes. Includes pstrain-launch (a whole cluster from one file,
restarts, Slurm and Kubernetes manifests), pstrain-compare,
pstrain-bench, pstrain-trace and pstrain-netlab (hosts as network
namespaces on one machine).")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SHLIBDEPS ON)
# What the tools import: yaml (every tool), numpy and matplotlib (the
# reports of pstrain-compare).
set(CPACK_DEBIAN_RUNTIME_PACKAGE_DEPENDS "python3, python3-yaml, python3-numpy, python3-matplotlib")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_RECOMMENDS "dataset-fashion-mnist")
# ssh: processes on other hosts; prometheus: pstrain-launch --prometheus;
# python3-torch: pstrain-bench's peer; iproute2 and openssh-server:
# pstrain-netlab's namespaces, links and sshd.
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SUGGESTS
    "openssh-client, prometheus, python3-torch, pstrain-cuda, iproute2, openssh-server")

# Python writes the tools' byte code beside their package's modules when
# they run (__pycache__, owned by no package): removed with the package, as
# py3clean does it for Debian's Python packages, so a purge leaves nothing
# behind.
file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/debian/prerm CONTENT "#!/bin/sh
set -e
rm -rf ${CPACK_PACKAGING_INSTALL_PREFIX}/${PSTRAIN_INSTALL_TOOLS_PACKAGE}/__pycache__
")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA ${PROJECT_BINARY_DIR}/debian/prerm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

set(CPACK_DEBIAN_CUDA_PACKAGE_NAME pstrain-cuda)
set(CPACK_DEBIAN_CUDA_DESCRIPTION "CUDA workers for pstrain
libpstrain_cuda.so: the CUDA backend and NCCL all-reduce of pstrain's
workers, loaded only when a worker is given a GPU. Needs NVIDIA's CUDA
${CUDAToolkit_VERSION} runtime, cuBLAS and NCCL 2 on the host.")
set(CPACK_DEBIAN_CUDA_PACKAGE_DEPENDS "pstrain (= ${CPACK_PACKAGE_VERSION})")
set(CPACK_DEBIAN_CUDA_PACKAGE_SHLIBDEPS OFF)

include(CPack)
