"""The trajectory viewer as a person sees it: real headless Chromium, static export and live /ui.

Both walks click sessions list -> session -> turn -> group, check every token element's
``data-*`` attributes against the exported samples, and save screenshots (tests/browser.py
says where). A hostile reply (script and event-handler HTML) must show as text and run nothing.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import defaultdict

import httpx
import pytest

from browser import TOKENS_JS, artifacts_dir, chromium, console_errors, wait_for
from helpers import ADMIN_KEY, admin_headers
from rlgate.cli import main as cli
from rlgate.config import GatewayConfig
from rlgate.engine.fake import FakeEngine
from rlgate.server.app import create_app
from rlgate.server.runner import ServerThread
from rlgate.store.base import MemoryStore
from rlgate.testing.runs import play, synthetic_run
from rlgate.trajectory.export import write_parquet

pytestmark = pytest.mark.slow
HOSTILE = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
ROWS_JS = ("return Array.from(document.querySelectorAll('tr.srow'), r => "
           "[r.querySelector('a.sid').textContent, !r.hidden]);")


@pytest.fixture(scope="module")
def run_rows(tokenizer, stop_ids):
    rows = asyncio.run(synthetic_run(tokenizer, stop_ids, groups=6, group_size=4, seed=3))
    rows[0]["messages"][1]["content"] = HOSTILE  # what an attacker-controlled task could contain
    return rows


def sessions_of(rows):
    out = defaultdict(list)
    for r in rows:
        out[r["session_id"]].append(r)
    return out


def assert_tokens_match(tokens, sample):
    assert len(tokens) == len(sample["input_ids"])
    assert [int(t[0]) for t in tokens] == sample["input_ids"]
    assert [int(t[2]) for t in tokens] == sample["versions"]
    assert [int(t[3]) for t in tokens] == sample["loss_mask"]
    for (_, lp, _, _), want in zip(tokens, sample["logprobs"], strict=True):
        assert math.isclose(float(lp), want, rel_tol=1e-6, abs_tol=1e-6)


def click(driver, text):
    """Click the link reading ``text`` once the page shows it (the viewer renders a view after a click)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 60, poll_frequency=0.05).until(
        expected_conditions.element_to_be_clickable((By.LINK_TEXT, text))).click()


def walk(driver, shots, sessions, prefix):
    """sessions list -> a forked session -> its second turn -> its group; returns what it checked."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    listed = wait_for(driver, ROWS_JS)
    assert sorted(r[0] for r in listed) == sorted(sessions)
    driver.save_screenshot(str(shots / f"{prefix}-1-sessions.png"))
    # filters: failures and relation
    want = {sid for sid, rows in sessions.items() if any("unparsed_tool_call" in r["flags"] for r in rows)}
    assert want, "the synthetic run should contain an unparsed tool call"
    Select(driver.find_element(By.NAME, "failures")).select_by_value("unparsed_tool_call")
    assert {r[0] for r in driver.execute_script(ROWS_JS) if r[1]} == want
    Select(driver.find_element(By.NAME, "failures")).select_by_value("")
    Select(driver.find_element(By.NAME, "relation")).select_by_value("fork")
    forked = {sid for sid, rows in sessions.items() if any(r["relation"] == "fork" for r in rows)}
    assert forked and {r[0] for r in driver.execute_script(ROWS_JS) if r[1]} == forked
    # session -> tree
    sid = sorted(forked)[0]
    click(driver, sid)
    wait_for(driver, f"return document.querySelector('main h1 .sid')?.textContent === {json.dumps(sid)};")
    assert len(driver.find_elements(By.CSS_SELECTOR, "main li.turn")) == len(sessions[sid])
    assert "no_prefix_match" in driver.find_element(By.CSS_SELECTOR, "main .why").text
    driver.save_screenshot(str(shots / f"{prefix}-2-session.png"))
    # turn -> token strip, toggle, raw request
    sample = sessions[sid][1]
    click(driver, sample["id"])
    tokens = wait_for(driver, TOKENS_JS)
    assert_tokens_match(tokens, sample)
    assert driver.find_element(By.CSS_SELECTOR, "main .badge.f-fork").is_displayed()
    raw = driver.find_element(By.CSS_SELECTOR, "main aside.raw pre").text
    assert json.loads(raw)["messages"] == sample["messages"]
    driver.save_screenshot(str(shots / f"{prefix}-3-turn-tokens.png"))
    driver.find_element(By.CSS_SELECTOR, "main button[data-show=messages]").click()
    assert driver.find_element(By.CSS_SELECTOR, "main .pane.messages").is_displayed()
    assert not driver.find_element(By.CSS_SELECTOR, "main .pane.tokens").is_displayed()
    driver.save_screenshot(str(shots / f"{prefix}-4-turn-messages.png"))
    # group -> members side by side
    group = sample_group = sessions[sid][0]["task_id"]
    click(driver, f"group {sample_group}")
    wait_for(driver, "return document.querySelectorAll('main section.member').length > 0;")
    members = driver.execute_script("return Array.from(document.querySelectorAll('main section.member'), "
                                    "m => m.dataset.session);")
    assert sorted(members) == sorted(s for s, rows in sessions.items() if rows[0]["task_id"] == group)
    driver.save_screenshot(str(shots / f"{prefix}-5-group.png"))
    return sid, sample


def test_static_export_in_chromium(run_rows, tiny_tokenizer_dir, tmp_path):
    parquet = tmp_path / "run.parquet"
    write_parquet(run_rows, parquet)
    out = tmp_path / "view.html"
    assert cli(["view", str(parquet), "--out", str(out), "--tokenizer", str(tiny_tokenizer_dir)]) == 0
    sessions = sessions_of(run_rows)
    shots = artifacts_dir(tmp_path)
    with chromium() as d:
        d.get(out.as_uri())
        walk(d, shots, sessions, "static")
        # the hostile message is text, and ran nothing
        hostile = run_rows[0]
        d.get(out.as_uri() + "#")
        click(d, hostile["session_id"])
        click(d, hostile["id"])
        d.find_element("css selector", "main button[data-show=messages]").click()
        assert HOSTILE in d.find_element("css selector", "main .pane.messages").text
        assert d.execute_script("return window.pwned === undefined;")
        assert console_errors(d) == []  # no CSP violation, no script error


def test_live_ui_in_chromium(tokenizer, stop_ids, tmp_path):
    script: list[str] = []
    engine = FakeEngine(tokenizer, script=lambda req: script.pop(0) if script else "ok")
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY, ui=True), engine, MemoryStore(), tokenizer,
                     stop_token_ids=stop_ids)
    shots = artifacts_dir(tmp_path)
    with ServerThread(app) as url:
        async def populate():
            async with httpx.AsyncClient(base_url=url, timeout=30) as c:
                await play(c, ADMIN_KEY, script, engine.bump_version, groups=4, group_size=3, seed=5, export=False)

        asyncio.run(populate())
        held = list(app.state.gateway.sessions.sessions)
        with chromium() as d:
            d.get(url + "/ui")
            assert d.current_url == url + "/ui/login"  # not logged in: the form
            d.find_element("name", "key").send_keys(ADMIN_KEY)
            d.find_element("css selector", "form[action='/ui/login'] button").click()
            wait_for(d, "return location.pathname === '/ui';")
            cookie = d.get_cookie("rlgate_ui")
            assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
            assert ADMIN_KEY not in cookie["value"]
            # the page's samples are what /export_trajectories gives (keep=true: the session stays)
            exported = {}
            for sid in held:
                r = httpx.post(url + "/export_trajectories", json={"session_id": sid, "keep": True},
                               headers=admin_headers())
                exported[sid] = [{**s, "session_id": sid, "task_id": r.json()["task_id"]}
                                 for s in r.json()["interactions"]]
            d.get(url + "/ui")
            walk(d, shots, exported, "live")
            for entry in d.execute_script("return performance.getEntriesByType('navigation')"
                                          ".concat(performance.getEntriesByType('resource'));"):
                assert ADMIN_KEY not in entry["name"]
            assert console_errors(d) == []
            d.find_element("css selector", "form[action='/ui/logout'] button").click()
            wait_for(d, "return location.pathname === '/ui/login';")
            d.get(url + "/ui")
            assert d.current_url == url + "/ui/login"


def test_long_turn_parts_and_hidden_characters_in_chromium(tokenizer, tiny_tokenizer_dir, tmp_path):
    """A long turn's static view holds its first and last part, linked by the pager; a bidi control
    shows as a visible escape in the rendered text, never as the character itself."""
    from rlgate.ui.render import TOKENS_PER_PART

    text = "evil \u202e gnp.exe " + "word " * 9000
    ids = tokenizer.encode(text, add_special_tokens=False)
    n = len(ids)
    row = {"session_id": "long", "task_id": "t\u2066", "id": "turn-1", "relation": "root", "input_ids": ids,
           "loss_mask": [0] * (n - 4) + [1] * 4, "logprobs": [-0.5] * n, "versions": [0] * n, "reward": 1.0,
           "messages": [{"role": "user", "content": text}], "output_message": {"role": "assistant", "content": "ok"}}
    parquet = tmp_path / "long.parquet"
    write_parquet([row], parquet)
    out = tmp_path / "view.html"
    assert cli(["view", str(parquet), "--out", str(out), "--tokenizer", str(tiny_tokenizer_dir)]) == 0
    parts = -(-n // TOKENS_PER_PART)
    with chromium() as d:
        d.get(out.as_uri())
        click(d, "long")
        click(d, "turn-1")
        start = wait_for(d, "return document.querySelector('main .strip')?.dataset.start;")
        assert start == "0"
        body = d.find_element("css selector", "main").text
        assert "\u202e" not in body and "\u2066" not in body and "⟨U+202E⟩" in body
        assert d.find_element("css selector", "main .strip kbd.cc").is_displayed()
        d.find_element("css selector", "main nav.pager a[rel=last]").click()
        wait_for(d, f"return document.querySelector('main .strip')?.dataset.start === '{(parts - 1) * TOKENS_PER_PART}';")
        assert len(wait_for(d, TOKENS_JS)) == n - (parts - 1) * TOKENS_PER_PART
        assert console_errors(d) == []
