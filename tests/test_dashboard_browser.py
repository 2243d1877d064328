"""The dashboard in a real Chromium (Debian's package, driven by Playwright; no browser download) against
`dhp serve` on loopback, filled through the API with bench-style plans and synthetic feedback.

Each test checks what a person sees: the rows of the table, one Gantt block per group, charts drawn (their
canvas holds the series' colour), re-plans side by side, the calibration scatter; keyboard use and labels;
and no console errors. Screenshots at 1280 px go to $DHP_SCREENSHOT_DIR (docs/dashboard.md's come from
``DHP_SCREENSHOT_DIR=docs/dashboard pytest tests/test_dashboard_browser.py``), else to a temporary folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
from dashboard_fill import JOB_STEPS, fill, request
from playwright.sync_api import sync_playwright

from api.dashboard.plan_view import runs
from api.local_server import LocalServer

CHROMIUM = os.environ.get("DHP_CHROMIUM", "/usr/bin/chromium")
if not Path(CHROMIUM).exists():
    if os.environ.get("CI"):
        raise RuntimeError(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium package")
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)", allow_module_level=True)

BLUE, VERMILION = "#0072B2", "#D55E00"  # the first two series colours (common.js)
WIDTH = 1280


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    out = Path(os.environ.get("DHP_SCREENSHOT_DIR") or tmp_path_factory.mktemp("screenshots"))
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = LocalServer(tmp_path_factory.mktemp("dashboard"), env={"DHP_QUEUE_LIMIT": "32"})
    filled = fill(srv.url)
    yield srv, filled
    srv.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": WIDTH, "height": 900}, base_url=server[0].url)
    pg = context.new_page()
    pg.problems = []
    pg.on(
        "console",
        lambda m: pg.problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None,
    )
    pg.on("pageerror", lambda e: pg.problems.append(f"page error: {e}"))
    yield pg
    context.close()
    assert pg.problems == [], "the browser reported problems"


def open_page(pg, path: str) -> None:
    pg.goto(path)
    pg.wait_for_selector("body[data-ready]", timeout=20_000)
    assert pg.get_attribute("body", "data-ready") == "1", pg.inner_text("#alert")
    assert pg.is_hidden("#alert")


def unlabelled_controls(pg) -> list[str]:
    """Form controls without an accessible name (a <label>, aria-label or aria-labelledby)."""
    return pg.evaluate("""() => [...document.querySelectorAll('input, select, textarea, button')]
        .filter((c) => c.type !== 'hidden' && !(c.labels && c.labels.length) && !c.getAttribute('aria-label')
                       && !c.getAttribute('aria-labelledby')
                       && !(c.tagName === 'BUTTON' && c.textContent.trim()))
        .map((c) => c.outerHTML.slice(0, 80))""")


def colour_pixels(pg, selector: str, hex_colour: str) -> int:
    """Pixels of a chart's canvas within a small distance of a colour: non-zero once that series is drawn."""
    return pg.evaluate(
        """([sel, hex]) => {
        const c = document.querySelector(sel + ' canvas');
        if (!c) return -1;
        const copy = document.createElement('canvas');  // read a copy: the page's canvas stays as the chart left it
        copy.width = c.width; copy.height = c.height;
        const ctx = copy.getContext('2d', { willReadFrequently: true });
        ctx.drawImage(c, 0, 0);
        const d = ctx.getImageData(0, 0, c.width, c.height).data;
        const rgb = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
        let n = 0;
        for (let i = 0; i < d.length; i += 4)
            if (d[i + 3] > 200 && Math.abs(d[i] - rgb[0]) < 12 && Math.abs(d[i + 1] - rgb[1]) < 12
                && Math.abs(d[i + 2] - rgb[2]) < 12) n++;
        return n;
    }""",
        [selector, hex_colour],
    )


def secs_text(v: float) -> str:
    """Seconds as the pages write them (common.js ``secs``)."""
    return f"{v:.1f}" if v >= 100 else f"{v:.2f}" if v >= 10 else f"{v:.3f}"


def no_horizontal_scroll(pg) -> bool:
    return pg.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")


def column(pg, label: str) -> int:
    """Index of the plans table's column headed ``label``."""
    return pg.locator("#plans thead th").all_inner_texts().index(label)


def test_plans_table(page, server, shots):
    srv, filled = server
    open_page(page, "/dashboard")
    listing = httpx.get(srv.url + "/v1/plans", params={"limit": 500}).json()
    rows = page.locator("#plans tbody tr")
    assert rows.count() == listing["total"] == len(filled.plans) + len(filled.job_steps)
    assert [rows.nth(k).get_attribute("data-id") for k in range(rows.count())] == [p["id"] for p in listing["items"]]
    assert f"of {listing['total']}" in page.inner_text("#page-info")
    assert unlabelled_controls(page) == [] and no_horizontal_scroll(page)
    page.screenshot(path=str(shots / "plans.png"), full_page=True)

    # Each step of the epoch job has an id of its own on screen: the job's first digits and the step.
    steps = [
        page.locator(f"#plans tbody tr[data-id='{pid}'] td:nth-child(2) a").inner_text() for pid in filled.job_steps
    ]
    assert len(set(steps)) == len(steps) == JOB_STEPS
    assert steps == [f"{filled.job_steps[0][:8]}\u2026 step {k}" for k in range(JOB_STEPS)]

    # The profile's name, and the backend asked for beside the one that ran.
    profile, backend = column(page, "Profile"), column(page, "Backend")
    for p in filled.plans:
        cells = page.locator(f"#plans tbody tr[data-id='{p['id']}'] td")
        assert cells.nth(profile).inner_text() == filled.profile_of[p["id"]]
        asked, ran = filled.asked_of[p["id"]], p["solver"]["backend"]
        assert cells.nth(backend).inner_text() == (ran if asked == ran else f"{asked} \u2192 {ran}")
    assert any(filled.asked_of[p["id"]] != p["solver"]["backend"] for p in filled.plans)  # an "auto" plan shows both

    # Sort by predicted step time with the keyboard: the heading's button, then Enter.
    page.focus("th[data-sort=predicted_step_time_s] button")
    page.keyboard.press("Enter")
    page.wait_for_selector("th[data-sort=predicted_step_time_s][aria-sort=ascending]")
    predicted = {p["id"]: p["predicted_step_time_s"] for p in listing["items"]}
    shown = [predicted[rows.nth(k).get_attribute("data-id")] for k in range(rows.count())]
    assert shown == sorted(shown) and "sort=predicted_step_time_s" in page.url
    page.keyboard.press("Enter")
    page.wait_for_selector("th[data-sort=predicted_step_time_s][aria-sort=descending]")

    # Filter by backend.
    page.select_option("#filters select[name=backend]", "highs")
    page.wait_for_function(
        "(k) => [...document.querySelectorAll('#plans tbody tr')].every((r) => r.children[k].textContent === 'highs')",
        arg=backend,
    )
    assert rows.count() == sum(1 for p in filled.plans if p["solver"]["backend"] == "highs") > 0


def _posted(srv, seed: int) -> dict:
    """A plan posted while the page is open. Its budget is roomy: on a busy machine the service refuses (422) a
    budget below the fixed work it measured at start-up, and this test is about the refresh, not the budget."""
    doc = request("dynamic-res", seed, 64, "heuristic", 1000, None)
    answer = httpx.post(srv.url + "/v1/plans", json=doc, timeout=30)
    assert answer.status_code == 201, answer.text
    return answer.json()


def test_live_refresh_shows_a_plan_posted_meanwhile(page, server):
    srv, _ = server
    open_page(page, "/dashboard")
    new = _posted(srv, 5)
    row = page.locator(f"#plans tbody tr[data-id='{new['id']}']")
    row.wait_for(timeout=10_000)
    assert "fresh" in row.get_attribute("class")
    assert page.locator("#plans tbody tr").first.get_attribute("data-id") == new["id"]
    assert "Updated at" in page.inner_text("#updated")
    # A later change re-reads the table: the row that arrived a moment ago keeps its highlight.
    later = _posted(srv, 6)
    page.locator(f"#plans tbody tr[data-id='{later['id']}']").wait_for(timeout=10_000)
    assert "fresh" in row.get_attribute("class")


def _showcase(filled) -> dict:
    """The filled plan with the most to see: groups spanning nodes, several micro-batches."""
    return max(
        filled.plans,
        key=lambda p: (
            sum(not g["intra_node"] for mb in p["micro_batches"] for g in mb["groups"]),
            len(p["micro_batches"]),
        ),
    )


def test_one_plan(page, server, shots):
    srv, filled = server
    plan = _showcase(filled)
    groups = [g for mb in plan["micro_batches"] for g in mb["groups"]]
    open_page(page, f"/dashboard/plans/{plan['id']}")
    blocks = page.locator(".gantt g.block")
    assert blocks.count() == len(groups) and int(page.get_attribute("#gantt", "data-blocks")) == len(groups)
    assert page.locator(".gantt g.block.inter").count() == sum(not g["intra_node"] for g in groups) > 0
    for k, g in enumerate(groups):
        label = blocks.nth(k).get_attribute("aria-label")
        assert f"size {g['degree']}" in label and f"{len(g['samples'])} sample(s)" in label
    # Micro-batches and groups are numbered from 0, as in the plan document and group_times_s.
    numbers = [(m, k) for m, mb in enumerate(plan["micro_batches"]) for k in range(len(mb["groups"]))]
    assert [blocks.nth(k).get_attribute("aria-label").split(":")[0] for k in range(len(groups))] == [
        f"Micro-batch {m}, group {k}" for m, k in numbers
    ]
    assert [
        tuple(int(t) for t in row[:2])
        for row in page.locator("#groups tbody tr").evaluate_all(
            "(rows) => rows.map((r) => [...r.children].map((c) => c.textContent))"
        )
    ] == numbers
    heads = page.locator(".gantt text.mb-label").evaluate_all(
        "(ts) => ts.map((t) => [Number(t.dataset.mb), t.textContent.match(/^(?:micro-batch |mb )?(\\d+)/)[1]])"
    )
    assert heads and [n for n, _ in heads] == list(range(len(heads)))
    assert all(str(n) == shown for n, shown in heads), heads
    assert page.locator("#groups tbody tr").count() == len(groups)
    # Every group has a measured time (the fill sends group times with each plan's first step):
    # one tick per run of ranks.
    assert page.locator(".gantt line.measured").count() == sum(len(runs(g["ranks"])) for g in groups)
    assert all(c.strip() != "\u2013" for c in page.locator("#groups tbody tr td:nth-child(8)").all_inner_texts())
    trace = plan["solver"]["trace"]
    assert int(page.get_attribute("#trace-chart", "data-points")) == len(trace) > 0
    assert colour_pixels(page, "#trace-chart", BLUE) > 20
    assert page.locator("#static-bars .bar").count() == (3 if plan.get("static_baseline") else 2)
    # The planner's phases: a segment shows its whole name or none; the legend names every phase.
    phases = page.locator("#phases div").evaluate_all(
        "(ds) => ds.map((d) => [d.textContent, d.scrollWidth <= d.clientWidth, d.title.split(':')[0]])"
    )
    assert phases and all(fits and text in ("", name) for text, fits, name in phases), phases
    assert any(text for text, _, _ in phases)
    legend = page.locator("#phases-legend .phase").all_inner_texts()
    assert [t.split(" ")[0] for t in legend] == [name for _, _, name in phases]
    planner = page.locator("#cards .card", has_text="Planner").inner_text()
    assert f"asked for {filled.asked_of[plan['id']]}" in planner
    assert page.locator("#comms tbody tr").count() == len(plan["communicators"])
    assert unlabelled_controls(page) == [] and no_horizontal_scroll(page)
    page.screenshot(path=str(shots / "plan.png"), full_page=True)

    # Keyboard: one tab stop in the chart, arrows move between blocks, and the detail line follows.
    page.focus(".gantt g.block[tabindex='0']")
    page.keyboard.press("ArrowRight")
    focused = page.evaluate("() => [document.activeElement.dataset.mb, document.activeElement.dataset.group]")
    second = (0, 1) if len(plan["micro_batches"][0]["groups"]) > 1 else (1, 0)
    assert tuple(int(x) for x in focused) == second
    assert page.inner_text("#block-detail").startswith(f"Micro-batch {second[0]}, group {second[1]}:")
    assert page.locator(".gantt g.block[tabindex='0']").count() == 1
    page.keyboard.press("End")
    assert page.evaluate("() => document.activeElement.getAttribute('aria-label')") == blocks.nth(
        len(groups) - 1
    ).get_attribute("aria-label")


def test_mixed_cluster_shows_which_nodes_hold_which_gpu(page, server, shots):
    _, filled = server
    plan = filled.mixed
    open_page(page, f"/dashboard/plans/{plan['id']}")
    assert page.is_visible("#gpu-legend")
    assert page.locator("#gpu-legend .gpu-type").all_inner_texts() == [
        "H100-SXM: nodes 0\u20131 (ranks 0\u201315)",
        "A100-80GB: nodes 2\u20133 (ranks 16\u201331)",
    ]
    assert page.locator(".gantt text.node-label").all_text_contents() == [
        "node 0 \u00b7 H100-SXM",
        "node 1 \u00b7 H100-SXM",
        "node 2 \u00b7 A100-80GB",
        "node 3 \u00b7 A100-80GB",
    ]
    strips = page.locator(".gantt rect.gpu-strip").evaluate_all("(rs) => rs.map((r) => r.getAttribute('fill'))")
    assert len(strips) == 4 and strips[0] == strips[1] != strips[2] == strips[3]
    assert unlabelled_controls(page) == [] and no_horizontal_scroll(page)
    page.screenshot(path=str(shots / "plan-mixed.png"), full_page=True)


def test_a_cluster_of_one_gpu_type_names_it_once(page, server):
    _, filled = server
    open_page(page, f"/dashboard/plans/{filled.plans[0]['id']}")
    assert page.inner_text("#gpu-legend") == "GPUs: H100-SXM on every node"
    assert page.locator(".gantt rect.gpu-strip").count() == 0
    assert page.locator(".gantt text.node-label").first.text_content() == "node 0"


def test_tuning_side_by_side_and_budget_sweep(page, server, shots):
    srv, filled = server
    plan = _showcase(filled)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    open_page(page, f"/dashboard/plans/{plan['id']}/tuning")
    # Before a sweep: a prompt, no empty chart or progress bar; backend auto is among the settings swept.
    assert page.is_visible("#sweep-prompt")
    assert page.is_hidden("#sweep-chart") and page.is_hidden("#sweep-progress") and page.is_hidden("#sweep-results")
    assert page.is_checked("#sweep input[value=auto]")
    page.screenshot(path=str(shots / "tuning-before-sweep.png"), full_page=True)
    page.select_option("#variant select[name=backend]", "highs")
    page.fill("#variant input[name=time_budget_ms]", "300")
    page.click("#variant button[type=submit]")
    page.wait_for_selector("#compare thead th:nth-child(3)", timeout=20_000)
    heads = page.locator("#compare thead th")
    spec = json.loads(httpx.get(f"{srv.url}/v1/dashboard/plans/{plan['id']}").text)["options"]
    assert heads.nth(1).inner_text().startswith(f"stored: {spec['backend']}, {spec['time_budget_ms']:g} ms")
    assert heads.nth(2).inner_text().startswith("highs, 300 ms")
    predicted_row = page.locator("#compare tbody tr").first.locator("td")
    assert predicted_row.nth(0).inner_text() == secs_text(plan["predicted_step_time_s"])
    assert float(predicted_row.nth(1).inner_text()) > 0

    page.uncheck("#sweep input[value=cpsat]")
    page.fill("#sweep input[name=budgets]", "50, 150, 400")
    page.click("#sweep button[type=submit]")
    page.wait_for_selector("#sweep-status:has-text('Sweep done')", timeout=30_000)
    assert page.is_hidden("#sweep-prompt") and page.is_visible("#sweep-chart") and page.is_visible("#sweep-progress")
    assert int(page.get_attribute("#sweep-chart", "data-points")) == 9
    assert colour_pixels(page, "#sweep-chart", BLUE) > 20 and colour_pixels(page, "#sweep-chart", VERMILION) > 20
    assert page.locator("#sweep-table tbody th").all_inner_texts() == ["auto", "heuristic", "highs"]
    best = json.loads(page.inner_text("#best-options"))
    assert set(best) >= {"backend", "time_budget_ms"}
    page.click("#copy-best")
    page.wait_for_selector("#copy-status:has-text('Copied')")
    assert json.loads(page.evaluate("() => navigator.clipboard.readText()")) == best
    assert unlabelled_controls(page) == [] and no_horizontal_scroll(page)
    page.screenshot(path=str(shots / "tuning.png"), full_page=True)


def test_a_tie_on_the_predicted_step_goes_to_the_cheaper_plan(page, server):
    """Every re-plan answers the stored plan's step time, 1e-12 relative faster per ms of budget: ties all
    (within 1e-9), so the best is the lowest budget swept, not the stored plan nor the costliest."""
    _, filled = server
    plan = _showcase(filled)
    stored = plan["predicted_step_time_s"]

    def near_tie(route):
        answer = route.fetch()
        body = answer.json()
        budget = body["options"]["time_budget_ms"]
        body["predicted_step_time_s"] = stored * (1 - 1e-12 * budget)
        route.fulfill(response=answer, json=body)

    page.route("**/replan", near_tie)
    open_page(page, f"/dashboard/plans/{plan['id']}/tuning")
    page.uncheck("#sweep input[value=highs]")
    page.uncheck("#sweep input[value=cpsat]")
    page.fill("#sweep input[name=budgets]", "400, 50, 150")
    page.click("#sweep button[type=submit]")
    page.wait_for_selector("#sweep-status:has-text('Sweep done')", timeout=30_000)
    best = json.loads(page.inner_text("#best-options"))
    assert best["time_budget_ms"] == 50 and best["backend"] in ("auto", "heuristic")


def test_calibration(page, server, shots):
    srv, filled = server
    open_page(page, "/dashboard/calibration")
    api = httpx.get(srv.url + "/v1/dashboard/calibration").json()
    assert int(page.get_attribute("#scatter", "data-points")) == api["total"] >= filled.feedback
    assert colour_pixels(page, "#scatter", BLUE) > 20 and colour_pixels(page, "#scatter", VERMILION) > 20
    assert colour_pixels(page, "#hist", BLUE) > 20
    rows = page.locator("#groups tbody tr")
    assert rows.count() == len(api["groups"]) == 3
    verdicts = {
        rows.nth(k).locator("td").nth(0).inner_text(): rows.nth(k).locator("td").nth(6).inner_text() for k in range(3)
    }
    assert verdicts == {"flexsp-gpt7b": "re-profile", "analytical": "ok", "stress-mixed-gpu": "watch"}
    assert rows.nth(0).locator("td").nth(0).get_attribute("title").startswith("FlexSP's fitted cost model")
    legend = page.locator("#scatter .u-legend .u-series th").all_inner_texts()
    assert {
        "flexsp-gpt7b \u00b7 h100-8x8",
        "analytical \u00b7 h100-8x8",
        "stress-mixed-gpu \u00b7 mixed-h100-a100",
    } <= {t.strip() for t in legend}
    options = page.locator("#filters select[name=profile] option").all_inner_texts()
    assert sorted(options) == ["analytical", "any", "flexsp-gpt7b", "stress-mixed-gpu"]
    assert unlabelled_controls(page) == [] and no_horizontal_scroll(page)
    page.screenshot(path=str(shots / "calibration.png"), full_page=True)

    page.select_option("#filters select[name=profile]", "analytical")
    page.wait_for_function("() => document.querySelector('#groups tbody').children.length === 1")
    analytical = sum(1 for p in filled.plans if filled.profile_of[p["id"]] == "analytical")
    assert int(page.get_attribute("#scatter", "data-points")) >= 3 * analytical


def test_calibration_refit(page, server, shots):
    """With a cluster and a model chosen, the view fits their profile to the posted group times, shows the
    per-group scatter and the terms beside the current ones, and stores the profile on request."""
    srv, filled = server
    open_page(page, "/dashboard/calibration")
    assert "Choose a cluster and a model" in page.inner_text("#refit-note")
    assert page.is_disabled("#fit-store")
    page.select_option("#filters select[name=cluster]", "h100-8x8")
    page.select_option("#filters select[name=model]", "qwen2-vl-7b")
    page.select_option("#filters select[name=profile]", label="flexsp-gpt7b")
    page.wait_for_selector("#fit-store:not([disabled])", timeout=30_000)
    measured = sum(
        len(p["micro_batches"][m]["groups"])
        for p in filled.plans
        if filled.profile_of[p["id"]] == "flexsp-gpt7b"
        for m in range(len(p["micro_batches"]))
    )
    assert int(page.get_attribute("#group-scatter", "data-points")) == measured
    assert colour_pixels(page, "#group-scatter", BLUE) > 20 and colour_pixels(page, "#group-scatter", VERMILION) > 20
    assert page.locator("#terms tbody tr").count() == 12
    cards = page.inner_text("#refit-cards")
    assert "Held-out micro-batch error" in cards and "was " in cards
    page.screenshot(path=str(shots / "calibration-refit.png"), full_page=True)
    page.click("#fit-store")
    page.wait_for_selector("#stored[data-name]")
    name = page.get_attribute("#stored", "data-name")
    assert name == "h100-8x8.qwen2-vl-7b.flexsp-gpt7b.v1" and f"learned:{name}" in page.inner_text("#stored")
    stored = httpx.get(srv.url + f"/v1/profiles/{name}").json()
    assert stored["base_profile"].startswith("FlexSP") and len(stored["sources"]["steps"]) == 3
    assert unlabelled_controls(page) == [] and no_horizontal_scroll(page)


def test_token_needed_then_given(browser, tmp_path):
    token = "dashboard-token-" + "x" * 12
    srv = LocalServer(tmp_path, env={"DHP_TOKENS": token})
    try:
        context = browser.new_context(viewport={"width": WIDTH, "height": 700}, base_url=srv.url)
        pg = context.new_page()
        problems: list[str] = []
        pg.on("console", lambda m: problems.append(m.text) if m.type == "error" and "401" not in m.text else None)
        pg.on("pageerror", lambda e: problems.append(str(e)))
        pg.goto("/dashboard")
        pg.wait_for_selector("body[data-ready=error]")
        assert "API token" in pg.inner_text("#alert")
        assert pg.evaluate("() => document.activeElement.id") == "token"
        pg.keyboard.type(token)
        pg.keyboard.press("Enter")
        pg.wait_for_selector("body[data-ready='1']")
        assert pg.is_hidden("#alert") and "0 plans" in pg.inner_text("#plans-caption")
        context.close()
        assert problems == []
    finally:
        srv.stop()


def test_screenshots_are_readable_size(shots):
    """Each page's screenshot exists and is 1280 px wide (docs/dashboard.md shows them)."""
    for name in ("plans", "plan", "tuning", "calibration", "calibration-refit"):
        path = shots / f"{name}.png"
        assert path.exists(), f"{name}.png was not taken"
        with path.open("rb") as f:
            head = f.read(24)
        assert int.from_bytes(head[16:20], "big") == WIDTH
