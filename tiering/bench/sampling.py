"""A server process a benchmark runs beside its clients: its CPU seconds, and its peak RSS sampled every 20 ms
(``ru_maxrss`` would not do: the server is not our child, or would include our own, inherited at fork)."""

from __future__ import annotations

import threading

import psutil


class ProcessSampler(threading.Thread):
    """Samples ``pid``'s RSS until ``stop`` (a daemon thread, started here)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.process = psutil.Process(pid)
        self.peak = 0
        self._done = threading.Event()
        self.start()

    def run(self) -> None:
        while not self._done.wait(0.02):
            try:
                self.peak = max(self.peak, self.process.memory_info().rss)
            except psutil.Error:
                return

    def cpu_seconds(self) -> float:
        times = self.process.cpu_times()
        return times.user + times.system

    def stop(self) -> None:
        self._done.set()
