"""The web console's overview with 1,000 queues, against 10 on the same server in the same
run: the ListQueues calls of one poll (QUEUE_VIEW_FULL, 1,000 a page), as the browser's
Resource Timing sees them, and the browser's main-thread work per poll (Chrome's
TaskDuration), in Debian's headless Chromium."""

from __future__ import annotations

import asyncio
import statistics

import grpc
from postbox.v1 import queue_service_pb2, queue_service_pb2_grpc

from bench.processes import Served, free_port
from bench.runner import Context, Row, scenario

MANY = 1000
FEW = 10
POLLS = 8
CREATE_CONCURRENCY = 16


def _spread(values: list[float]) -> str:
    return f"median of {len(values)} polls, range {min(values):.1f}-{max(values):.1f}"


def _measure(url: str, queues: int, polls: int) -> tuple[list[float], list[float]]:
    """Per poll: the ListQueues calls' duration and the main thread's work (ms)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--window-size=1400,1000"):  # fmt: skip
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    try:
        driver.execute_cdp_cmd("Performance.enable", {})
        driver.get(url)
        wait = WebDriverWait(driver, 120)
        wait.until(
            lambda d: d.find_element(By.ID, "queue-count").text == f"{queues} of {queues} queues"
        )
        calls_script = (
            "return performance.getEntriesByType('resource')"
            ".filter(e => e.name.endsWith('/ListQueues')).map(e => e.duration)"
        )

        def task_seconds() -> float:
            metrics = driver.execute_cdp_cmd("Performance.getMetrics", {})["metrics"]
            return next(m["value"] for m in metrics if m["name"] == "TaskDuration")

        pages = -(-queues // 1000)
        seen = len(driver.execute_script(calls_script))
        before = task_seconds()
        work: list[float] = []
        for _ in range(polls):
            target = seen + pages

            # The poll's last page answered; its rows are drawn in the same task.
            def answered(d: webdriver.Chrome, n: int = target) -> bool:
                return len(d.execute_script(calls_script)) >= n

            wait.until(answered)
            wait.until(
                lambda d: d.find_element(By.ID, "queue-count").text.endswith(f"{queues} queues")
            )
            seen = target
            now = task_seconds()
            work.append((now - before) * 1000)
            before = now
        durations = driver.execute_script(calls_script)[-polls * pages :]
        per_poll = [sum(durations[i : i + pages]) for i in range(0, len(durations), pages)]
        return per_poll, work
    finally:
        driver.quit()


async def _create(target: str, names: list[str]) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = queue_service_pb2_grpc.QueueServiceStub(channel)
        gate = asyncio.Semaphore(CREATE_CONCURRENCY)

        async def create(name: str) -> None:
            async with gate:
                await stub.CreateQueue(
                    queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name=name))
                )

        await asyncio.gather(*(create(name) for name in names))


@scenario("console_overview", f"the console's overview polling {MANY} queues, vs {FEW}")
async def run(ctx: Context) -> list[Row]:
    port = free_port()
    with Served.postbox(ctx.db.url, "--console-port", str(port), name="console") as served:
        url = f"http://127.0.0.1:{port}/"
        names = [f"console-bench-{number:04d}" for number in range(MANY)]
        await _create(served.target, names[:FEW])
        few_calls, few_work = await asyncio.to_thread(_measure, url, FEW, POLLS)
        await _create(served.target, names[FEW:])
        many_calls, many_work = await asyncio.to_thread(_measure, url, MANY, POLLS)
    return [
        Row(
            f"console overview, ListQueues per poll, {MANY} queues",
            "ms",
            statistics.median(many_calls),
            statistics.median(few_calls),
            f"{FEW} queues",
            note=f"{_spread(many_calls)}; {FEW} queues: {_spread(few_calls)}",
        ),
        Row(
            f"console overview, browser main-thread work per poll, {MANY} queues",
            "ms",
            statistics.median(many_work),
            statistics.median(few_work),
            f"{FEW} queues",
            note=f"{_spread(many_work)}; {FEW} queues: {_spread(few_work)}",
        ),
    ]
