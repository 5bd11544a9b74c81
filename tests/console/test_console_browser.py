"""The web console in a real browser: headless Chromium (Debian's `chromium` and
`chromium-driver`, which `make tools` installs) driven by selenium against the
all-in-one server as `make run` starts it (`python -m services`, its own process).

A conversation, a summary, memories and a summary job are made over gRPC; then the
browser opens the console, finds the conversation, sees its entries, the summary
boundary and the last window, follows a memory's source link to the entries it came
from, opens a shared link, and reads the backlog figure. A hostile message and a
hostile memory (markup and script) are shown as text and run nothing. Screenshots go
to .artifacts/console/ (RUNIFOLD_ARTIFACTS_DIR), kept by CI as the run's artifacts;
with RUNIFOLD_DOCS_SCREENSHOTS=1 those docs/console.md shows are also written to docs/img/.

The home page lists the namespaces (ListNamespaces), a namespace's conversations come
newest first with their first user message, charts have axes and units, and with
RUNIFOLD_CONSOLE_ACTIONS=1 the chat box runs a turn through StreamConversation over
Connect, its stages shown as they arrive.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.common.v1 import common_pb2
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from services.common import stubs
from services.common.auth import AuthSettings
from services.common.http.settings import HttpSettings
from services.common.server import RunningServer, serving
from services.transcript.component import TranscriptComponent
from tests.support.grpc_calls import authorization, jwt_token, user
from tests.support.process import ServiceProcess, service_process
from tests.support.settings import server_settings
from tests.support.tools import ROOT

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="no chromium and chromedriver here: `make tools` installs them "
    "(apt-get install chromium chromium-driver); it could not on this machine",
)

ARTIFACTS = Path(os.environ.get("RUNIFOLD_ARTIFACTS_DIR", ROOT / ".artifacts")) / "console"
DOCS_IMG = ROOT / "docs" / "img"
WAIT_S = 30.0
# Markup that would run script if the console ever put text into the page as HTML.
HOSTILE_ENTRY = (
    '<img src=x onerror="document.title=\'pwned\'"><script>document.title="pwned"</script>'
)
HOSTILE_MEMORY = '<b>bold</b><img src=x onerror="window.pwned=1"> remembers nothing'
TURNS = 3
PAIRS = 8  # appends of a user and an assistant message after the turns
SUMMARY_THROUGH = 6
SOURCE = (3, 4)
# An external source that is a valid absolute URI and would run a script if followed.
HOSTILE_URI = "javascript:window.pwned=1"


@dataclass
class Seeded:
    namespace: str
    conversation_id: str
    newer_id: str
    entries: int
    memory_id: str
    hostile_memory_id: str


@pytest.fixture(scope="module")
async def server(
    shared_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ServiceProcess]:
    env = {
        "DATABASE_URL": shared_database_url,
        "RUNIFOLD_MIGRATE": "auto",
        # No summary worker: the requested job stays in the backlog for the console.
        "RUNIFOLD_SUMMARY_WORKERS": "0",
        "RUNIFOLD_AGENT_MODEL_URL": "offline",
        # The write actions, each behind a confirmation (read-only by default: the
        # guarded server below has them off).
        "RUNIFOLD_CONSOLE_ACTIONS": "1",
    }
    data_dir = tmp_path_factory.mktemp("console")
    async with service_process("services", env, data_dir, timeout=180) as process:
        assert process.http_url, f"no console line:\n{''.join(process.output)}"
        yield process


@pytest.fixture(scope="module")
async def seeded(server: ServiceProcess) -> Seeded:
    """A conversation made over gRPC: turns, appends (one hostile), a summary, memories
    and a pending summary job."""
    namespace = f"console-{uuid.uuid4().hex[:10]}"
    async with grpc.aio.insecure_channel(server.address) as channel:
        transcript, summary = stubs.transcript(channel), stubs.summary(channel)
        memory, agent = stubs.memory(channel), stubs.agent(channel)
        created = await transcript.CreateConversation(
            transcript_pb.CreateConversationRequest(namespace=namespace, labels={"app": "demo"})
        )
        cid = created.conversation.conversation_id
        for i in range(TURNS):
            await agent.RunConversation(
                agent_pb.RunConversationRequest(
                    namespace=namespace,
                    conversation_id=cid,
                    input=[user(f"question {i}: my favourite colour is teal")],
                    turn_id=f"turn-{i}",
                ),
                timeout=60,
            )
        for i in range(PAIRS):
            text = HOSTILE_ENTRY if i == 0 else f"follow-up {i}"
            await transcript.AppendEntries(
                transcript_pb.AppendEntriesRequest(
                    namespace=namespace,
                    conversation_id=cid,
                    messages=[
                        user(text),
                        common_pb2.Message(role=common_pb2.ROLE_ASSISTANT, text=f"noted {i}"),
                    ],
                )
            )
        await summary.CommitSummary(
            summary_pb.CommitSummaryRequest(
                namespace=namespace,
                conversation_id=cid,
                through_sequence=SUMMARY_THROUGH,
                text="The user asked three questions about colours.",
            )
        )
        source = memory_pb.MemorySource(
            conversation_id=cid, from_sequence=SOURCE[0], through_sequence=SOURCE[1]
        )
        kept = await memory.UpsertMemory(
            memory_pb.UpsertMemoryRequest(
                namespace=namespace,
                content="The user's favourite colour is teal.",
                sources=[source],
            )
        )
        hostile = await memory.UpsertMemory(
            memory_pb.UpsertMemoryRequest(
                namespace=namespace,
                content=HOSTILE_MEMORY,
                # A source outside the transcript too: an absolute URI, and a hostile one.
                sources=[source, memory_pb.MemorySource(external_uri=HOSTILE_URI)],
            )
        )
        await summary.RequestSummary(
            summary_pb.RequestSummaryRequest(
                namespace=namespace, conversation_id=cid, window=16, summary_batch=64
            )
        )
        newer = await transcript.CreateConversation(
            transcript_pb.CreateConversationRequest(namespace=namespace)
        )
        await transcript.AppendEntries(
            transcript_pb.AppendEntriesRequest(
                namespace=namespace,
                conversation_id=newer.conversation.conversation_id,
                messages=[user("Where did we leave   the\nquarterly report?")],
            )
        )
    return Seeded(
        namespace,
        cid,
        newer.conversation.conversation_id,
        TURNS * 2 + PAIRS * 2,
        kept.memory.memory_id,
        hostile.memory.memory_id,
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # as root in CI
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1000",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The driver named explicitly: selenium downloads nothing.
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


def shot(driver: Any, name: str, docs: str = "") -> None:
    """A screenshot in the artifacts; with RUNIFOLD_DOCS_SCREENSHOTS=1, also as
    docs/img/<docs>.png when the docs show it."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))
    if docs and os.environ.get("RUNIFOLD_DOCS_SCREENSHOTS") == "1":
        driver.save_screenshot(str(DOCS_IMG / f"{docs}.png"))


def waiting(driver: Any) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1)


def css(driver: Any, selector: str) -> Any:
    """The element once it is there (polled with a deadline)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    return waiting(driver).until(ec.presence_of_element_located((By.CSS_SELECTOR, selector)))


def all_css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def no_script_ran(driver: Any) -> None:
    assert driver.title == "Runifold console"
    assert driver.execute_script("return window.pwned === undefined") is True
    # The markup is text on the page, never elements.
    assert not all_css(driver, "#view img, #view script, #view b")


def test_the_console_shows_a_conversation_its_memories_and_the_backlog(
    server: ServiceProcess, seeded: Seeded, browser: Any
) -> None:
    driver, ns, cid = browser, seeded.namespace, seeded.conversation_id
    # The home page lists the namespaces (authentication off: every one with data).
    driver.get(f"{server.http_url}/")
    home = css(driver, f'#namespace-list li[data-namespace="{ns}"] a')
    shot(driver, "0-home", docs="console-home")
    home.click()
    # The conversations of the namespace, newest first, each with its first user
    # message (whitespace made single spaces) and its counts.
    row = css(driver, f'tr[data-conversation="{cid}"]')
    assert "app=demo" in row.text
    listed = [r.get_attribute("data-conversation") for r in all_css(driver, "tr.conversation")]
    assert listed == [seeded.newer_id, cid]
    newer = css(driver, f'tr[data-conversation="{seeded.newer_id}"] td.preview .text')
    assert newer.text == "Where did we leave the quarterly report?"
    assert row.find_element("css selector", "td.preview .text").text.startswith("question 0:")
    counts = [td.text for td in row.find_elements("css selector", "td.num")]
    assert counts == [str(seeded.entries), str(TURNS + PAIRS)]
    assert css(driver, "#conversation-count").text == "2 conversations, newest first"
    shot(driver, "1-conversations", docs="console-conversations")
    row.find_element("css selector", "td.preview a").click()

    # Its entries, the summary boundary and the last window.
    waiting(driver).until(lambda d: len(all_css(d, "#entries li.entry")) == seeded.entries)
    boundary = css(driver, "#summary-boundary")
    assert boundary.get_attribute("data-through") == str(SUMMARY_THROUGH)
    before = driver.execute_script(
        "return document.getElementById('summary-boundary').previousElementSibling.id"
    )
    assert before == f"entry-{SUMMARY_THROUGH}"
    summarized = [e.get_attribute("data-sequence") for e in all_css(driver, "li.entry.summarized")]
    assert summarized == [str(i) for i in range(1, SUMMARY_THROUGH + 1)]
    window_first = seeded.entries - 16 + 1
    after_marker = driver.execute_script(
        "return document.getElementById('window-start').nextElementSibling.id"
    )
    assert after_marker == f"entry-{window_first}"
    assert css(driver, "#window-facts").text == f"entries {window_first}\u2013{seeded.entries}"
    assert len(all_css(driver, "li.entry.in-window")) == 16
    assert len(all_css(driver, "li.turn-marker")) == TURNS + PAIRS  # one per append
    assert css(driver, "#summarized-through").text == str(SUMMARY_THROUGH)
    assert "three questions" in css(driver, "#summary").text
    # The hostile message is on the page, as the text it is.
    hostile = css(driver, f"#entry-{TURNS * 2 + 1} .text")
    assert hostile.text == HOSTILE_ENTRY
    no_script_ran(driver)
    assert [b.text for b in all_css(driver, "button.action")] == [
        "Request summary",
        "Erase conversation",
    ]
    shot(driver, "2-conversation")

    # The chat box: a turn through StreamConversation over Connect, shown as it arrives.
    css(driver, "#chat-input").send_keys("hello from the console")
    css(driver, "#chat-send").click()
    waiting(driver).until(lambda d: len(all_css(d, "#entries li.entry")) == seeded.entries + 2)
    stages = [li.text for li in all_css(driver, "#chat-stages li")]
    assert stages[0] == "sent" and "calling the model" in stages
    assert stages[-1] == "committed (version 12)"
    assert "hello from the console" in css(driver, f"#entry-{seeded.entries + 1} .text").text
    driver.execute_script("document.getElementById('chat').scrollIntoView()")
    shot(driver, "2b-chat", docs="console-chat")
    # A window that holds the whole transcript has no start to mark (the marker used to
    # sit above entry 1, inside the summarized part).
    driver.get(f"{server.http_url}/?namespace={ns}&conversation={seeded.newer_id}")
    assert css(driver, "#window-facts").text == "entries 1\u20131 (the whole transcript)"
    assert css(driver, "#entry-1") and not all_css(driver, "#window-start")

    # Memories; a memory's source link opens the entries it came from.
    css(driver, 'a[data-tab="memories"]').click()
    item = css(driver, f'li.memory[data-memory="{seeded.memory_id}"]')
    assert "teal" in item.text
    hostile_item = css(driver, f'li.memory[data-memory="{seeded.hostile_memory_id}"]')
    assert HOSTILE_MEMORY in hostile_item.text
    # Its origin: the transcript range (a link), and the external URI as text, never a link.
    external = hostile_item.find_element("css selector", ".source.external")
    assert external.text == HOSTILE_URI
    assert not external.find_elements("css selector", "a")
    no_script_ran(driver)
    shot(driver, "3-memories")
    item.find_element("css selector", ".source a").click()
    waiting(driver).until(lambda d: len(all_css(d, "#entries li.entry.highlighted")) == 2)
    highlighted = [e.get_attribute("id") for e in all_css(driver, "li.entry.highlighted")]
    assert highlighted == [f"entry-{SOURCE[0]}", f"entry-{SOURCE[1]}"]
    assert f"conversation={cid}" in driver.current_url
    assert f"entry={SOURCE[0]}" in driver.current_url
    shot(driver, "4-memory-source")

    # A link a person shares opens the same memory.
    driver.get(f"{server.http_url}/?namespace={ns}&memory={seeded.memory_id}")
    assert "teal" in css(driver, "#memory").text

    # The backlog: the job requested over gRPC, and the server's counters.
    css(driver, 'a[data-tab="backlog"]').click()
    waiting(driver).until(lambda d: css(d, "#backlog-depth").text == "1")
    depth = css(driver, 'figure.chart[data-series="summary_jobs_depth"]')
    # Axes: 0 to the largest value in the series' unit, five minutes to now.
    ticks = [t.text for t in depth.find_elements("css selector", "svg text")]
    assert ticks == ["1", "0", "jobs", "\u22125 min", "now"]
    assert "jobs" in depth.find_element("css selector", "figcaption").text
    age = css(driver, 'figure.chart[data-series="summary_jobs_oldest_age_seconds"]')
    assert age.get_attribute("data-unit") == "s"
    shot(driver, "5-backlog", docs="console-backlog")
    errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    assert not errors, f"the console logged errors (a CSP violation, a failed call): {errors}"


async def test_a_write_action_runs_only_once_confirmed(
    server: ServiceProcess, seeded: Seeded, browser: Any
) -> None:
    """Deleting a memory from the console: dismissed, nothing happens; confirmed, the
    memory is gone (as GetMemory over gRPC says)."""
    driver, ns, mid = browser, seeded.namespace, seeded.hostile_memory_id
    async with grpc.aio.insecure_channel(server.address) as channel:
        memory = stubs.memory(channel)
        request = memory_pb.GetMemoryRequest(namespace=ns, memory_id=mid)
        driver.get(f"{server.http_url}/?namespace={ns}&memory={mid}")
        button = css(driver, "button.action.danger")
        assert button.text == "Delete memory"
        button.click()
        waiting(driver).until(lambda d: d.switch_to.alert)
        assert mid in driver.switch_to.alert.text
        driver.switch_to.alert.dismiss()
        assert (await memory.GetMemory(request)).memory.memory_id == mid
        css(driver, "button.action.danger").click()
        waiting(driver).until(lambda d: d.switch_to.alert).accept()
        waiting(driver).until(lambda d: "tab=memories" in d.current_url)
        with pytest.raises(grpc.aio.AioRpcError) as gone:
            await memory.GetMemory(request)
        assert gone.value.code() == grpc.StatusCode.NOT_FOUND
        assert not all_css(driver, f'li.memory[data-memory="{mid}"]')


# What a conversation's page shows, read in one go (the page may be drawn again between
# two reads of selenium's).
PAGE_STATE = """
return {
  texts: [...document.querySelectorAll('#entries li.entry')].map(
    (e) => e.querySelector('.text')?.textContent ?? ''),
  roles: [...document.querySelectorAll('#entries li.entry .role')].map((r) => r.textContent),
  stages: [...document.querySelectorAll('#chat-stages li')].map((li) => li.textContent),
};
"""


async def test_edit_and_regenerate_forks_before_the_entry_and_runs_the_turn_on_the_fork(
    server: ServiceProcess, browser: Any
) -> None:
    """ "Edit and regenerate" on a user entry inside an append: the fork shares the
    entries before it (a fork point that cuts the append), the edited text runs as a turn
    on the fork, and the browser lands on the fork, whose page links to its origin; the
    source, unchanged, lists its forks (and theirs)."""
    driver, ns = browser, f"console-fork-{uuid.uuid4().hex[:8]}"
    async with grpc.aio.insecure_channel(server.address) as channel:
        transcript = stubs.transcript(channel)
        created = await transcript.CreateConversation(
            transcript_pb.CreateConversationRequest(namespace=ns)
        )
        cid = created.conversation.conversation_id
        said = ["Name a colour.", "Red.", "Another one?", "Blue."]
        roles = [common_pb2.ROLE_USER, common_pb2.ROLE_ASSISTANT] * 2
        # One append: editing entry 3 forks through 2, inside it.
        await transcript.AppendEntries(
            transcript_pb.AppendEntriesRequest(
                namespace=ns,
                conversation_id=cid,
                messages=[
                    common_pb2.Message(role=r, text=t) for r, t in zip(roles, said, strict=True)
                ],
            )
        )

        def edit() -> str:
            driver.get(f"{server.http_url}/?namespace={ns}&conversation={cid}")
            css(driver, "#entry-4")
            assert css(driver, "#forks").text == "Forks\nNone."
            # On user entries only.
            assert [
                b.find_element("xpath", "..").get_attribute("id")
                for b in all_css(driver, "li.entry button.edit")
            ] == ["entry-1", "entry-3"]
            css(driver, "#entry-3 button.edit").click()
            field = css(driver, "#entry-3 textarea.edit-input")
            assert field.get_attribute("value") == "Another one?"
            field.clear()
            field.send_keys("A warmer one?")
            shot(driver, "7-edit")
            css(driver, "#entry-3 button.edit-send").click()
            # The fork's page, the turn run on it, once drawn with the turn's entries.
            waiting(driver).until(lambda d: f"conversation={cid}" not in d.current_url)
            settled = "return document.getElementById('chat-log')?.dataset.settled === '1'"
            waiting(driver).until(lambda d: d.execute_script(settled))
            fork = str(driver.current_url).split("conversation=")[1].split("&")[0]
            page = driver.execute_script(PAGE_STATE)
            assert page["texts"] == ["Name a colour.", "Red.", "A warmer one?", page["texts"][3]]
            assert page["roles"] == ["user", "assistant", "user", "assistant"]
            assert page["stages"][:2] == ["forked at entry 2", "sent"]
            assert page["stages"][-1] == "committed (version 2)"
            origin = css(driver, "#fork-origin a")
            assert origin.text == f"…{cid[-8:]} after entry 2"
            driver.execute_script("document.getElementById('conversation-facts').scrollIntoView()")
            shot(driver, "8-fork", docs="console-fork")
            # Its origin: the source at the fork point.
            origin.click()
            waiting(driver).until(lambda d: f"conversation={cid}" in d.current_url)
            assert "entry=2" in driver.current_url
            waiting(driver).until(lambda d: len(all_css(d, "li.entry.highlighted")) == 1)
            assert css(driver, "li.entry.highlighted").get_attribute("id") == "entry-2"
            listed = css(driver, f'#fork-list li.fork[data-conversation="{fork}"]')
            assert listed.text == f"…{fork[-8:]} shares entries 1\u20132"
            return fork

        fork = await asyncio.to_thread(edit)
        got = await transcript.GetConversation(
            transcript_pb.GetConversationRequest(namespace=ns, conversation_id=fork)
        )
        assert (
            got.conversation.fork_origin.conversation_id,
            got.conversation.fork_origin.through_sequence,
        ) == (cid, 2)
        # The source is as it was.
        source = await transcript.ListEntries(
            transcript_pb.ListEntriesRequest(namespace=ns, conversation_id=cid)
        )
        assert [e.message.text for e in source.entries] == said
        nested = await transcript.ForkConversation(
            transcript_pb.ForkConversationRequest(
                namespace=ns, conversation_id=fork, through_sequence=3
            )
        )
        nested_id = nested.conversation.conversation_id

    def forks_of_forks() -> None:
        driver.get(f"{server.http_url}/?namespace={ns}&conversation={cid}")
        rows = waiting(driver).until(
            lambda d: (
                len(all_css(d, "#fork-list li.fork")) == 2 and all_css(d, "#fork-list li.fork")
            )
        )
        assert [r.get_attribute("data-conversation") for r in rows] == [fork, nested_id]
        assert rows[1].text == (
            f"…{nested_id[-8:]} shares entries 1\u20133 of …{fork[-8:]} (a fork of a fork)"
        )
        driver.execute_script("document.getElementById('forks').scrollIntoView()")
        shot(driver, "9-forks")
        errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        assert not errors, f"the console logged errors: {errors}"

    await asyncio.to_thread(forks_of_forks)


async def test_the_console_is_served_with_its_content_security_policy(
    server: ServiceProcess,
) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        for path in ("/", "/console.js", "/console/api/session"):
            response = await client.get(f"{server.http_url}{path}")
            assert response.status_code == 200, path
            policy = response.headers["content-security-policy"]
            assert "script-src 'self'" in policy and "default-src 'none'" in policy
            assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
            assert response.headers["x-content-type-options"] == "nosniff"
            assert "frame-ancestors 'none'" in policy


SECRET = "console-suite-secret-" + "s" * 32


@pytest.fixture
async def guarded(shared_database_url: str) -> AsyncIterator[RunningServer]:
    """TranscriptService alone, with JWT authentication and the console."""
    async with serving(
        [TranscriptComponent()],
        server_settings(),
        database_url=shared_database_url,
        auth=AuthSettings(mode="jwt", jwt_secret=SECRET, jwt_audience="runifold"),
        http=HttpSettings(listen_address="127.0.0.1:0", console=True),
    ) as running:
        yield running


async def test_with_authentication_the_console_reads_with_the_user_s_own_token(
    guarded: RunningServer, browser: Any, namespace: str
) -> None:
    """No token, nothing shown but the sign-in; with a token granting one namespace, its
    conversations (what the token may read), read-only, and another namespace refused."""
    assert guarded.http is not None
    token = jwt_token(SECRET, namespace)
    async with grpc.aio.insecure_channel(guarded.address) as channel:
        transcript = stubs.transcript(channel)
        created = await transcript.CreateConversation(
            transcript_pb.CreateConversationRequest(namespace=namespace),
            metadata=authorization(token),
        )
        await transcript.AppendEntries(
            transcript_pb.AppendEntriesRequest(
                namespace=namespace,
                conversation_id=created.conversation.conversation_id,
                messages=[user("hello")],
            ),
            metadata=authorization(token),
        )
    cid = created.conversation.conversation_id
    url = guarded.http.url

    # The server runs in this event loop: the browser is driven from a thread.
    def drive() -> None:
        driver = browser
        driver.get(f"{url}/")
        driver.execute_script("sessionStorage.clear()")
        driver.get(f"{url}/?namespace={namespace}")
        waiting(driver).until(lambda d: css(d, "#sign-in").is_displayed())
        waiting(driver).until(lambda d: "unauthenticated" in css(d, "#status").text)
        assert not all_css(driver, "tr.conversation")
        field = css(driver, "#token")
        field.send_keys(token)
        css(driver, "#token-form button").click()
        row = css(driver, f'tr[data-conversation="{cid}"]')
        assert row.is_displayed()
        assert not css(driver, "#sign-in").is_displayed()
        assert css(driver, "#who").text == "app: 1 namespace(s)"
        shot(driver, "6-signed-in")
        # This port serves TranscriptService alone: the console asks nothing else, and
        # offers no write action (they are off unless RUNIFOLD_CONSOLE_ACTIONS=1).
        row.find_element("css selector", "a").click()
        css(driver, "#entry-1")
        assert "not served on this port" in css(driver, "#summary").text
        assert not css(driver, 'a[data-tab="memories"]').is_displayed()
        assert not all_css(driver, "button.action")
        assert not all_css(driver, "button.edit")  # no edit and regenerate either
        assert css(driver, "#forks").text == "Forks\nNone."
        # The home page lists the namespaces a token grants that hold conversations,
        # and only those (the database holds many others). (A token of one namespace
        # opens it at once.)
        two = jwt_token(SECRET, namespace, f"{namespace}-empty")
        use_token = "sessionStorage.setItem('runifold.console.token', arguments[0])"
        driver.execute_script(use_token, two)
        driver.get(f"{url}/")
        css(driver, f'#namespace-list li[data-namespace="{namespace}"]')
        assert [li.text for li in all_css(driver, "#namespace-list li")] == [namespace]
        driver.execute_script(use_token, token)
        # Another namespace: refused by the API itself, the console shows the refusal.
        driver.get(f"{url}/?namespace={namespace}-other")
        waiting(driver).until(lambda d: "NAMESPACE_NOT_GRANTED" in css(d, "#status").text)
        driver.execute_script("sessionStorage.clear()")

    await asyncio.to_thread(drive)
