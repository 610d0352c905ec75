"""Where the tools find what they run when not told: the pstrain binary, the
default job (and the click-through one), the Python benchmarks and tools/launch.

In a source checkout this package sits in tools/: build/pstrain, cluster.yaml
and bench/ of the checkout. An installed copy (cmake --install, the Debian
package) has install_layout.py in the package, written by the install, which
names the installed ones relative to the package's folder, so the tree works
under any prefix (cmake/install.cmake).
"""

import os

PACKAGE = os.path.dirname(os.path.realpath(__file__))
# The folder of the command scripts, the package's parent in both layouts.
TOOLS = os.path.dirname(PACKAGE)
LAUNCH = os.path.join(TOOLS, "launch")

try:
    from . import install_layout
except ImportError:  # a source checkout
    _ROOT = os.path.dirname(TOOLS)
    BINARY = os.path.join(_ROOT, "build", "pstrain")
    CLUSTER_EXAMPLE = os.path.join(_ROOT, "cluster.yaml")
    BENCH = os.path.join(_ROOT, "bench")
else:
    BINARY = os.path.normpath(os.path.join(PACKAGE, install_layout.BINARY))
    CLUSTER_EXAMPLE = os.path.normpath(os.path.join(PACKAGE, install_layout.CLUSTER_EXAMPLE))
    BENCH = os.path.normpath(os.path.join(PACKAGE, install_layout.BENCH))
# The click-through job: examples/ beside cluster.yaml when installed, of the
# checkout in a source tree.
CTR_EXAMPLE = os.path.join(os.path.dirname(CLUSTER_EXAMPLE),
                           "ctr.yaml" if os.path.basename(os.path.dirname(CLUSTER_EXAMPLE)) ==
                           "examples" else os.path.join("examples", "ctr.yaml"))
