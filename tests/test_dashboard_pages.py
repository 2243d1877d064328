"""Every dashboard page is its content in one frame (``page.html``), with the navigation bar from one list
(``api.dashboard.endpoints.NAVIGATION``)."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from api.app import create_app
from api.dashboard.endpoints import FRAME, NAVIGATION, PAGES, pages
from api.service.settings import Settings


def page_addresses() -> dict[str, str | None]:
    """Each page of the dashboard's router (a made-up id in its path) and the navigation link it marks as
    its own: its address when the bar links it, else none."""
    links = {href for _, href in NAVIGATION}
    out: dict[str, str | None] = {}
    for route in pages.routes:
        address = re.sub(r"\{\w+\}", "abc", route.path).rstrip("/") or "/dashboard"
        out[address] = address if address in links else None
    return out


def test_the_frame_holds_each_mark_once_and_the_pages_only_their_content():
    frame = (PAGES / FRAME).read_text()
    for mark in ("title", "script", "navigation", "content"):
        assert frame.count(f"<!-- page: {mark} -->") == 1, mark
    for page in PAGES.glob("*.html"):
        if page.name == FRAME:
            continue
        text = page.read_text()
        assert re.fullmatch(r"<!-- title: [^<>]+ -->", text.partition("\n")[0]), page.name
        assert (PAGES / page.with_suffix(".js").name).exists(), page.name
        for frame_part in ("<html", "<head", "<main", 'aria-label="Dashboard"', 'id="token-form"'):
            assert frame_part not in text, (page.name, frame_part)


def test_every_page_links_every_view_and_marks_its_own(tmp_path):
    with TestClient(create_app(Settings(data_dir=tmp_path))) as client:
        addresses = page_addresses()
        assert {"/dashboard", "/dashboard/calibration", "/dashboard/plans/abc/tuning"} <= set(addresses)
        for address, current in addresses.items():
            html = client.get(address).text
            nav = re.search(r'<nav aria-label="Dashboard">(.*?)</nav>', html, re.S)
            assert nav is not None, address
            links = re.findall(r'<a href="([^"]+)"( aria-current="page")?>([^<]+)</a>', nav.group(1))
            assert [(label, href) for href, _, label in links] == list(NAVIGATION), address
            assert [href for href, mark, _ in links if mark] == ([current] if current else []), address


def test_every_sortable_column_of_the_plans_table_is_a_sort_the_api_takes(tmp_path):
    script = (PAGES / "plans.js").read_text()
    keys = re.findall(r'sort: "(\w+)"', script)
    assert len(keys) >= 10 and "predicted_step_time_s" in keys
    with TestClient(create_app(Settings(data_dir=tmp_path))) as client:
        for key in keys:
            assert client.get("/v1/dashboard/plans", params={"sort": key}).status_code == 200, key
        assert client.get("/v1/dashboard/plans", params={"sort": "no_such_column"}).status_code == 422
