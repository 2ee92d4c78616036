"""A Spark standalone cluster on 127.0.0.1: a master and a worker from PySpark's own launcher.

``spark-class org.apache.spark.deploy.master.Master`` and ``...deploy.worker.Worker``, both from the
installed pyspark (no separate Spark download). Executors run on the worker as their own JVMs and
Python workers, so a job submitted to ``spark://127.0.0.1:<port>`` reads its input itself, as on a
real cluster. Used by the export's cluster test; ``stop`` ends both process groups.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from deploy.procs import free_port, spawn, stop_groups, wait_ready


@dataclass(frozen=True)
class SparkCluster:
    master_url: str
    web_url: str
    master_pid: int
    worker_pid: int
    work_dir: Path

    def alive_workers(self) -> int:
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=5) as response:
            state = json.load(response)
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def stop(self) -> None:
        stop_groups([self.worker_pid, self.master_pid], timeout=20)


def _spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def start_cluster(directory: Path, *, cores: int = 2, memory: str = "2g") -> SparkCluster:
    """Start a master and one worker (``cores``, ``memory``) logging under ``directory``; wait until the
    worker is registered. Raises StackError (with the log tail) if either does not come up."""
    directory.mkdir(parents=True, exist_ok=True)
    port, web_port, worker_web = free_port(), free_port(), free_port()
    env = {
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(directory),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_HOME": str(Path(_spark_class()).parent.parent),
    }
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    master_log = directory / "master.log"
    master = spawn([_spark_class(), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(port), "--webui-port", str(web_port)], master_log, env=env)  # fmt: skip
    master_url = f"spark://127.0.0.1:{port}"
    web_url = f"http://127.0.0.1:{web_port}"
    worker_log = directory / "worker.log"
    worker = None
    try:
        wait_ready("spark master", master, lambda: urllib.request.urlopen(web_url, timeout=2).status == 200, master_log)
        work_dir = directory / "work"
        worker = spawn([_spark_class(), "org.apache.spark.deploy.worker.Worker", master_url, "--host", "127.0.0.1",
                        "--webui-port", str(worker_web), "--cores", str(cores), "--memory", memory,
                        "--work-dir", str(work_dir)], worker_log, env=env)  # fmt: skip
        cluster = SparkCluster(master_url, web_url, master, worker, work_dir)
        wait_ready("spark worker", worker, lambda: cluster.alive_workers() >= 1, worker_log)
        return cluster
    except BaseException:
        stop_groups([worker, master], timeout=20)
        raise
