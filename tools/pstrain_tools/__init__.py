"""pstrain's Python tools. The commands are thin scripts beside this package
(tools/launch, tools/compare, tools/bench, tools/trace, tools/netlab,
tools/report.py; installed as pstrain-launch, pstrain-compare,
pstrain-bench, pstrain-trace and pstrain-netlab) that call a module's
main(); the modules:

  launch             the launcher: its command line, the cluster's processes
                     (local and over ssh), their output, launch.json, CURVE
                     keys, --prometheus and --emit
  supervisor         the restart policy: which ended process is restarted
                     after what backoff, and which one stops the run
  cluster_config     the cluster file as `pstrain --check` resolves it, and
                     the `auto` values made explicit for this host
  paths              where the tools find pstrain, the default job, the
                     Python benchmarks and tools/launch, in a source checkout
                     or installed
  emit_slurm         --emit slurm: the sbatch script
  emit_k8s           --emit k8s|tfjob: the Kubernetes manifests
  prometheus_server  a Prometheus server for one run (--prometheus)
  compare            runs one job in several modes through tools/launch
  report             the report of runs' metrics (compare's, or by hand)
  bench              runs the benchmarks in bench/ and their peers, side by
                     side
  trace              reads the timelines of `pstrain --trace`: merges a
                     run's, breaks a step down into its parts
  netlab             hosts as network namespaces with shaped links, for
                     multi-host runs on one machine

The benchmarks themselves live in bench/: the C++ ones and the Python ones
(bench_torch.py, the PyTorch peers; bench_recovery.py).
"""
