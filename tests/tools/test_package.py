#!/usr/bin/python3
"""The Debian packages (tools/package, cmake/package.cmake) and the image
recipe (Containerfile). cpack builds the packages from the build tree of
$PSTRAIN, as tools/package does; their control fields are checked against
what the packaged programs link and the tools import, and the Containerfile
against the dependencies the package declares. Then both packages are
installed into this machine's system with dpkg (root needed, as in CI), the
default job trains from the installed files alone (no build tree on PATH,
no $PSTRAIN), and the packages are purged again, also when the test fails.
"""

import ast
import fnmatch
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

import support
from pstrain_tools import emit_k8s

BUILD = os.path.dirname(support.PSTRAIN)
PACKAGES = ("pstrain", "pstrain-cuda")
INSTALLED_DIR = "/usr/lib/pstrain"  # cmake/install.cmake's lib/pstrain under /usr
EXAMPLE = "/usr/share/doc/pstrain/examples/cluster.yaml"
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# What the default job must reach in its 3 epochs (README: about 0.86).
MIN_ACCURACY = 0.84


def run(cmd, **kwargs):
    return subprocess.run(cmd, capture_output=True, text=True, **kwargs)


def field(deb, name):
    return run(["dpkg-deb", "-f", deb, name]).stdout.strip()


def package_names(relation):
    """The package names of a Depends-style field, each alternative's
    included: "libc6 (>= 2.34), a | b" -> [["libc6"], ["a", "b"]]."""
    return [[alt.split()[0] for alt in item.split("|")]
            for item in relation.split(",") if item.strip()]


def owners(path_glob):
    """The installed packages owning files that match `path_glob`."""
    out = run(["dpkg-query", "-S", path_glob]).stdout
    return {line.split(":")[0].strip() for line in out.splitlines()
            if ":" in line and not line.startswith("diversion")}


def needed_libraries(elf):
    out = run(["readelf", "-d", elf]).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def is_python(path):
    """A Python module, or a program whose #! line runs Python."""
    if path.endswith(".py"):
        return True
    if os.path.islink(path):
        return False
    with open(path, "rb") as f:
        first = f.readline(200)
    return first.startswith(b"#!") and b"python" in first


class PackageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="pstrain-package-")
        config = os.path.join(BUILD, "CPackConfig.cmake")
        if not os.path.isfile(config):
            raise AssertionError(f"no {config}: $PSTRAIN must be in a configured build tree")
        r = run(["cpack", "--config", config, "-B", cls.tmp.name])
        if r.returncode != 0:
            raise AssertionError(f"cpack failed:\n{r.stdout}\n{r.stderr}")
        found = {os.path.basename(p).split("_")[0]: p
                 for p in glob.glob(os.path.join(cls.tmp.name, "*.deb"))}
        if "pstrain" not in found:
            raise AssertionError(f"cpack made no pstrain package:\n{r.stdout}")
        cls.deb = found["pstrain"]
        cls.cuda_deb = found.get("pstrain-cuda")  # only from a CUDA build
        cls.tree = os.path.join(cls.tmp.name, "tree")
        subprocess.run(["dpkg-deb", "-x", cls.deb, cls.tree], check=True)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_depends_cover_what_the_programs_link_and_the_tools_import(self):
        depends = package_names(field(self.deb, "Depends"))
        declared = {n for alts in depends for n in alts}
        # A dependency also counts through its own Depends one level down:
        # libopenblas0 is satisfied by libopenblas0-pthread or another
        # flavour, which is what owns libopenblas.so.0.
        reachable = set(declared)
        for name in declared:
            sub = run(["dpkg-query", "-W", "-f", "${Depends}", name]).stdout
            reachable |= {n for alts in package_names(sub) for n in alts}
        sonames = set()
        for dirpath, _, files in os.walk(self.tree):
            for f in files:
                path = os.path.join(dirpath, f)
                if not os.path.islink(path) and is_elf(path):
                    sonames.update(needed_libraries(path))
        self.assertIn("libzmq.so.5", sonames, "the programs were not found in the package")
        for soname in sorted(sonames):
            providers = owners(f"*/{soname}")
            self.assertTrue(providers, f"no installed package provides {soname}")
            self.assertTrue(providers & reachable,
                            f"{soname} (from {sorted(providers)}) is not in Depends: {declared}")
        self.assertFalse([s for s in sonames if re.match(r"lib(cuda|cublas|nccl)", s)],
                         "a CPU host must be able to install pstrain: it links no CUDA library")

        # Every module the installed tools and Python benchmarks import that
        # is not theirs or Python's own comes from a package pstrain depends
        # on (or, for an optional peer, suggests).
        installed = os.path.join(self.tree, INSTALLED_DIR.lstrip("/"))
        sources = [os.path.join(d, f) for d, _, files in os.walk(installed) for f in files
                   if is_python(os.path.join(d, f))]
        self.assertIn(os.path.join(installed, "tools", "pstrain_tools", "launch.py"), sources)
        imported = set()
        for path in sources:
            with open(path) as src:
                tree = ast.parse(src.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    imported |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    imported.add(node.module.split(".")[0])
        third_party = imported - {"pstrain_tools"} - set(sys.stdlib_module_names)
        self.assertIn("yaml", third_party)
        offered = declared | {n for alts in package_names(field(self.deb, "Suggests"))
                              for n in alts}
        for module in sorted(third_party):
            spec = subprocess.run(
                [sys.executable, "-c",
                 f"import importlib.util as u; s = u.find_spec({module!r}); "
                 "print(s.origin if s else '')"],
                capture_output=True, text=True).stdout.strip()
            if not spec:
                continue  # not installed here: only an optional peer may be absent
            packages = owners(os.path.realpath(spec))
            self.assertTrue(packages & offered,
                            f"the tools import {module} (package {sorted(packages)}), which "
                            "the pstrain package neither depends on nor suggests")

    def test_installed_tools_find_the_installed_files(self):
        """The package's tools, through install_layout.py, name the binary,
        the example and the PyTorch peer where the package puts them (here
        in the unpacked tree), and the package holds no byte code."""
        tools = os.path.join(self.tree, INSTALLED_DIR.lstrip("/"), "tools")
        # The unpacked package, not the source tree's one on $PYTHONPATH.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        r = run([sys.executable, "-B", "-c", "from pstrain_tools import paths; "
                 "print(paths.BINARY); print(paths.CLUSTER_EXAMPLE); print(paths.BENCH)"],
                cwd=tools, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        binary, example, bench = r.stdout.splitlines()
        tree = os.path.realpath(self.tree)
        self.assertEqual(binary, os.path.join(tree, INSTALLED_DIR.lstrip("/"), "pstrain"))
        self.assertEqual(example, os.path.join(tree, EXAMPLE.lstrip("/")))
        self.assertTrue(os.path.isfile(os.path.join(bench, "bench_torch.py")), bench)
        self.assertFalse([d for d, dirs, _ in os.walk(self.tree) if "__pycache__" in dirs])

    def test_cuda_package_holds_the_library_and_depends_on_pstrain_alone(self):
        if self.cuda_deb is None:
            self.skipTest("built without CUDA: no pstrain-cuda package")
        version = field(self.deb, "Version")
        self.assertEqual(field(self.cuda_deb, "Depends"), f"pstrain (= {version})")
        files = [line.split()[-1] for line in
                 run(["dpkg-deb", "-c", self.cuda_deb]).stdout.splitlines()
                 if not line.startswith("d")]
        self.assertEqual(files, [f".{INSTALLED_DIR}/libpstrain_cuda.so"])
        self.assertFalse([f for f in run(["dpkg-deb", "-c", self.deb]).stdout.splitlines()
                          if "libpstrain_cuda" in f], "the CUDA library is in pstrain too")

    def test_containerfile_installs_what_the_package_declares(self):
        with open(os.path.join(support.ROOT, "Containerfile")) as f:
            text = f.read().replace("\\\n", " ")
        self.assertRegex(text, r"(?m)^FROM debian:12\s*$")
        installs = re.findall(r"apt-get install ((?:[^&\n])*)", text)
        self.assertEqual(len(installs), 1, "one apt-get install of the runtime packages")
        listed = {w for w in installs[0].split() if not w.startswith("-")}
        declared = {alts[0] for rel in ("Depends", "Recommends")
                    for alts in package_names(field(self.deb, rel))}
        self.assertFalse(declared - listed,
                         "the package declares what the Containerfile does not install")
        self.assertFalse(listed - declared,
                         "the Containerfile installs what the package does not declare")
        (copied,) = re.findall(r"(?m)^COPY (\S+\.deb) ", text)
        self.assertTrue(fnmatch.fnmatch(os.path.basename(self.deb), copied),
                        f"COPY {copied} does not match {os.path.basename(self.deb)}")
        if self.cuda_deb:
            self.assertFalse(fnmatch.fnmatch(os.path.basename(self.cuda_deb), copied))

    def test_installed_package_trains_the_default_job(self):
        if os.geteuid() != 0:
            self.fail("this test installs the packages into the system with dpkg: run it as "
                      "root (CI does)")
        installed = [p for p in PACKAGES
                     if "install ok installed" in run(["dpkg-query", "-W", "-f",
                                                       "${Status}", p]).stdout]
        if installed:
            self.fail(f"{installed} already installed on this machine; this test installs its "
                      f"own build and purges it afterwards: remove them first "
                      f"(dpkg --purge {' '.join(installed)})")
        if not os.path.isdir("/usr/share/datasets/fashion-mnist"):
            self.fail("the default job's data set is missing: install dataset-fashion-mnist "
                      "(tools/setup does)")
        self.addCleanup(self.purge)
        debs = [self.deb] + ([self.cuda_deb] if self.cuda_deb else [])
        r = run(["dpkg", "-i"] + debs)
        self.assertEqual(r.returncode, 0, f"dpkg -i failed:\n{r.stdout}\n{r.stderr}")

        env = {"PATH": SYSTEM_PATH, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
        self.assertEqual(shutil.which("pstrain", path=SYSTEM_PATH), emit_k8s.IMAGE_BINARY,
                         "the manifests' default --image-binary is not where pstrain installs")
        built = run([support.PSTRAIN, "--version"]).stdout.splitlines()
        version = run(["pstrain", "--version"], env=env).stdout.splitlines()
        self.assertEqual(version[:1], built[:1], "the installed pstrain is another build")
        if self.cuda_deb:
            cuda = next(line for line in version if line.startswith("CUDA:"))
            self.assertNotIn("not found beside", cuda,
                             "pstrain-cuda's library is not where pstrain looks")

        work = tempfile.mkdtemp(prefix="pstrain-installed-", dir=self.tmp.name)
        run_dir = os.path.join(work, "run")
        ports = [support.free_port(), support.free_port()]
        servers = ", ".join(f"{{host: 127.0.0.1, port: {p}}}" for p in ports)
        launcher = subprocess.Popen(
            ["pstrain-launch", EXAMPLE, "--run-dir", run_dir, "--set", f"ps=[{servers}]"],
            cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            out, _ = launcher.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            self.stop(launcher)
            self.fail("the default job did not finish within 240 s")
        self.assertEqual(launcher.returncode, 0, out[-3000:])
        accuracy = re.search(r"\[worker0\] final test accuracy (0\.\d+)", out)
        self.assertIsNotNone(accuracy, out[-3000:])
        print(f"installed package: default job final test accuracy {accuracy.group(1)}",
              file=sys.stderr)
        self.assertGreaterEqual(float(accuracy.group(1)), MIN_ACCURACY)

        record = support.read_json(os.path.join(run_dir, "launch.json"))
        binary = os.path.join(INSTALLED_DIR, "pstrain")
        self.assertEqual(record["pstrain"], {"binary": binary, "version": version[0]})
        for p in record["processes"]:
            self.assertEqual(p["command"][0], binary, p["command"])
            with open(os.path.join(run_dir, f"{p['name']}.log")) as f:
                self.assertTrue(f.readline().rstrip().endswith(f"] {version[0]}"),
                                f"{p['name']}.log does not start with the version")

    def stop(self, launcher):
        """Ends the launcher we started (it stops its own children)."""
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(timeout=15)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait()

    def purge(self):
        r = run(["dpkg", "--purge"] + list(PACKAGES))
        self.assertEqual(r.returncode, 0, f"dpkg --purge failed:\n{r.stdout}\n{r.stderr}")
        self.assertFalse(os.path.exists(INSTALLED_DIR), f"{INSTALLED_DIR} left behind")


if __name__ == "__main__":
    unittest.main()
