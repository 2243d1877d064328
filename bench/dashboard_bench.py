"""Page load time and download size of the tuning dashboard for a store of many plans.

    .venv/bin/python -m bench.dashboard_bench                  # 10,000 plans, 64 ranks x 512 samples each
    .venv/bin/python -m bench.dashboard_bench --plans 2000 --real 12 --samples 256

Plans ``--real`` distinct requests through the API of a real ``dhp serve`` (bench workloads on the 64-rank H100
preset, heuristic and HiGHS backends), then copies their stored rows under new ids and times until the store
holds ``--plans`` (documents as large as real ones; the copies spread over 30 days), and gives 30% of them three
steps of synthetic feedback. Then, against the restarted server: each JSON endpoint's latency (median of 5
after one warm-up call) and, in Debian's Chromium with an empty cache, each page's time until its figures are
shown (``performance.now()`` when the page marks itself ready) and the bytes the browser downloaded. The first
call after a start and the later ones are both printed (the service keeps some of what it read in memory).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from sqlalchemy import func, insert, select

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from dashboard_fill import request  # noqa: E402

from api.local_server import LocalServer  # noqa: E402
from api.store import Store  # noqa: E402
from api.store.models import PLANS, FeedbackRow  # noqa: E402

WORKLOADS = ["video", "long-text", "mixed", "image-sft", "anyres", "dynamic-res"]


def seed_real(url: str, n: int, samples: int) -> None:
    with httpx.Client(base_url=url, timeout=120) as client:
        for k in range(n):
            backend, budget = ("highs", 200.0) if k % 4 == 3 else ("heuristic", 200.0)
            client.post(
                "/v1/plans", json=request(WORKLOADS[k % len(WORKLOADS)], k, samples, backend, budget, None)
            ).raise_for_status()


def replicate(store: Store, total: int, seed: int = 0) -> None:
    """Copy the stored plans under new ids until there are ``total``; feedback on 30% of them."""
    rng = random.Random(seed)
    table = PLANS
    with store.engine.connect() as conn:
        real = [dict(r._mapping) for r in conn.execute(select(table))]
    now = datetime.now(UTC)
    rows: list[dict] = []
    feedback: list[dict] = []
    with store.engine.begin() as conn:
        for k in range(total - len(real)):
            row = dict(real[k % len(real)])
            t = now - timedelta(seconds=30 * 86400 * (1 - k / total))
            row.update(id=uuid.uuid4().hex, request_hash=uuid.uuid4().hex * 2, created_at=t, finished_at=t)
            rows.append(row)
            if rng.random() < 0.3:
                for _ in range(3):
                    measured = row["predicted_step_time_s"] * rng.gauss(1.04, 0.03)
                    feedback.append(
                        {
                            "plan_id": row["id"],
                            "created_at": t,
                            "measured_step_time_s": measured,
                            "predicted_step_time_s": row["predicted_step_time_s"],
                            "feedback_json": "{}",
                        }
                    )
            if len(rows) >= 500:  # the plans first, then their feedback
                conn.execute(insert(table), rows)  # type: ignore[arg-type]  # a Table is what insert takes
                rows = []
                if feedback:
                    conn.execute(insert(FeedbackRow.__table__), feedback)  # type: ignore[arg-type]
                    feedback = []
        if rows:
            conn.execute(insert(table), rows)  # type: ignore[arg-type]  # a Table is what insert takes
        if feedback:
            conn.execute(insert(FeedbackRow.__table__), feedback)  # type: ignore[arg-type]


def time_endpoints(url: str, plan_id: str) -> list[tuple[str, float, float, int]]:
    paths = [
        "/v1/dashboard/plans",
        "/v1/dashboard/plans?sort=speedup",
        "/v1/dashboard/plans?sort=budget_ms",
        "/v1/dashboard/plans?sort=measured_step_time_s",
        "/v1/dashboard/plans?backend=highs&offset=1000",
        "/v1/dashboard/changes",
        "/v1/dashboard/facets",
        "/v1/dashboard/calibration",
        f"/v1/dashboard/plans/{plan_id}",
    ]
    out = []
    with httpx.Client(base_url=url, timeout=120) as client:
        for p in paths:
            t = time.perf_counter()
            client.get(p).raise_for_status()
            first = (time.perf_counter() - t) * 1000
            times = []
            size = 0
            for _ in range(5):
                t = time.perf_counter()
                r = client.get(p)
                times.append((time.perf_counter() - t) * 1000)
                size = len(r.content)
            out.append((p, first, statistics.median(times), size))
    return out


def time_pages(url: str, plan_id: str, chromium: str, repeats: int = 3) -> list[tuple[str, float, int]]:
    from playwright.sync_api import sync_playwright

    pages = [
        "/dashboard",
        "/dashboard?sort=speedup",
        f"/dashboard/plans/{plan_id}",
        f"/dashboard/plans/{plan_id}/tuning",
        "/dashboard/calibration",
    ]
    out = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        for path in pages:
            times, sizes = [], []
            for _ in range(repeats):
                context = browser.new_context(viewport={"width": 1280, "height": 900})  # an empty cache each time
                page = context.new_page()
                page.goto(url + path)
                page.wait_for_selector("body[data-ready='1']", timeout=120_000)
                ready_ms = page.evaluate("() => performance.now()")
                page.wait_for_load_state("networkidle")
                size = page.evaluate("""() => performance.getEntriesByType('navigation')
                                          .concat(performance.getEntriesByType('resource'))
                                          .reduce((a, e) => a + (e.transferSize || 0), 0)""")
                times.append(ready_ms)
                sizes.append(size)
                context.close()
            out.append((path, statistics.median(times), int(statistics.median(sizes))))
        browser.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", type=int, default=10_000)
    ap.add_argument("--real", type=int, default=24, help="distinct plans made through the API before copying")
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--data", type=Path, help="store folder (default: a temporary one)")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--reuse", action="store_true", help="measure the store already in --data without filling it")
    args = ap.parse_args()
    data = args.data or Path(tempfile.mkdtemp(prefix="dhp-dashboard-bench-"))
    t0 = time.perf_counter()
    if not args.reuse:
        server = LocalServer(data, env={"DHP_QUEUE_LIMIT": "32"})
        try:
            seed_real(server.url, args.real, args.samples)
        finally:
            server.stop()
    store = Store(f"sqlite:///{(data / 'dhp.sqlite3').resolve()}")
    if not args.reuse:
        replicate(store, args.plans)
    with store.engine.connect() as conn:
        plan_id = conn.execute(select(PLANS.c.id).order_by(PLANS.c.created_at.desc()).limit(1)).scalar_one()
        plans = conn.scalar(select(func.count()).select_from(PLANS))
        fb = conn.scalar(select(func.count()).select_from(FeedbackRow))
    store.close()
    size_mb = (data / "dhp.sqlite3").stat().st_size / 1e6
    print(
        f"store: {plans} plans (64 ranks x {args.samples} samples), {fb} feedback, {size_mb:.0f} MB; "
        f"ready in {time.perf_counter() - t0:.0f} s"
    )
    server = LocalServer(data)
    try:
        print("\n| endpoint | first call after start, ms | median ms after it | bytes |\n|---|---|---|---|")
        for path, first, ms, size in time_endpoints(server.url, plan_id):
            print(f"| `{path.replace(plan_id, '{id}')}` | {first:.0f} | {ms:.1f} | {size:,} |")
        print("\n| page | ready after (ms, median of 3, empty cache) | downloaded bytes |\n|---|---|---|")
        for path, ms, size in time_pages(server.url, plan_id, args.chromium):
            print(f"| `{path.replace(plan_id, '{id}')}` | {ms:.0f} | {size:,} |")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
