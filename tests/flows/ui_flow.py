"""A small flow for the UI's browser test: `train` logs a loss-like series into the store while it runs
and CPU samples (written with SeriesWriter, as the trainer and @monitor do) and, with --fail 1, raises after its
last step."""

import time

from stoker import FlowSpec, Parameter, current, step


class UiFlow(FlowSpec):
    steps = Parameter("steps", default=10, type=int)
    fail = Parameter("fail", default=0, type=int)
    pause = Parameter("pause", default=0.5, type=float)

    @step
    def start(self):
        print("starting", flush=True)
        self.next(self.train)

    @step
    def train(self):
        from stoker.store.blobs import open_store
        from stoker.store.series import SeriesWriter, series_prefix

        prefix = series_prefix("metrics", current.flow_name, current.run_id, current.step_name, current.task_id,
                               current.retry_count)
        store = open_store(current.store_url)
        writer = SeriesWriter(store, prefix, interval=0.3)
        monitor = SeriesWriter(store, series_prefix("monitor", current.flow_name, current.run_id, current.step_name,
                                                    current.task_id, current.retry_count, node=0), interval=0.3)
        for i in range(self.steps):
            loss = 4.0 / (1 + 0.3 * i)
            writer.add({"step": i, "loss": loss, "lr": 1e-3 * min(1.0, (i + 1) / 3), "tokens_per_s": 1000.0 + 10 * i,
                        "mfu": 0.05, "time": time.time()})
            monitor.add({"node": 0, "cpu_percent": 20.0 + i, "rss_mb": 100.0 + i, "time": time.time()})
            print(f"step {i} loss {loss:.4f}", flush=True)
            time.sleep(self.pause)
        writer.close()
        monitor.close()
        if self.fail:
            raise ValueError("ui test failure: the loss exploded")
        self.final_loss = loss
        self.next(self.end)

    @step
    def end(self):
        print(f"done, final loss {self.final_loss:.4f}", flush=True)


if __name__ == "__main__":
    UiFlow()
