// The Runifold console: namespaces -> conversations -> the transcript (paged, with the
// summary boundary, the last window and the appends), memories with links to the
// entries they came from, and the summary backlog with the service's own counters.
//
// Everything shown comes from the public API (api.js). Transcript, summary and memory
// text is untrusted: it is only ever put into the page as text (textContent, never
// innerHTML), and the server's Content-Security-Policy runs no script but these files.
// Links a person can share: ?namespace=NS&conversation=ID[&entry=SEQ], ?namespace=NS&memory=ID.
// With actions on, "edit and regenerate" on a user entry forks the conversation before it
// (ForkConversation) and runs the edited turn on the fork; a page shows where a fork came
// from and the forks made of it (ListForks).

import { AGENT, MEMORY, SUMMARY, TRANSCRIPT, RpcError, call, getJson, int, setToken, stream, token, turnId } from "./api.js";
import { showBacklog } from "./backlog.js";
import { el, roleName, status, time, view } from "./dom.js";

const PAGE = 200; // entries per ListEntries page
const WINDOW = 16; // the window shown as "last window" (the orchestrator's default)
const FOLLOW_MS = 3000; // how often an open conversation is checked for new entries
const FORKS_PAGE = 50; // forks shown on a conversation's page (ListForks' first page)

const state = {
  session: null,
  namespace: "",
  follow: null, // the timer that follows the open conversation
  metrics: null,
  history: {},
  lastTurn: null, // the turn sent from the chat box: { conversation, stages, text, done }
};

// -- links ---------------------------------------------------------------------------

function link(params, ...children) {
  const href = "?" + new URLSearchParams(params).toString();
  return el("a", {
    href,
    onclick: (event) => {
      if (event.ctrlKey || event.metaKey || event.shiftKey || event.button !== 0) return;
      event.preventDefault();
      navigate(params);
    },
  }, ...children);
}

function failed(error) {
  if (error instanceof RpcError) {
    if (error.code === "unauthenticated") showSignIn(error.message);
    status(error.describe(), true);
  } else {
    status(String(error), true);
  }
}

// A process may host only some services (one service per process in production): the
// console asks only those this port serves, and says what it cannot show.
function served(service) {
  return !state.session || (state.session.services || []).includes(service);
}

function actionsOn() {
  return Boolean(state.session && state.session.actions);
}

// -- routing ------------------------------------------------------------------------

function params() {
  return Object.fromEntries(new URLSearchParams(location.search));
}

function navigate(next, replace = false) {
  const clean = Object.fromEntries(Object.entries(next).filter(([, v]) => v !== undefined && v !== ""));
  const url = "?" + new URLSearchParams(clean).toString();
  if (replace) history.replaceState(null, "", url);
  else history.pushState(null, "", url);
  route();
}

window.addEventListener("popstate", () => route());

function stopFollowing() {
  if (state.follow) clearInterval(state.follow);
  state.follow = null;
}

function stopMetrics() {
  if (state.metrics) clearInterval(state.metrics);
  state.metrics = null;
}

async function route() {
  stopFollowing();
  stopMetrics();
  status("");
  const p = params();
  state.namespace = p.namespace || "";
  document.getElementById("namespace").value = state.namespace;
  const tab = p.conversation ? "conversations" : p.memory ? "memories" : p.tab || "conversations";
  const needs = { conversations: TRANSCRIPT, memories: MEMORY, backlog: SUMMARY };
  for (const a of document.querySelectorAll("#tabs a")) {
    a.classList.toggle("active", a.dataset.tab === tab);
    a.hidden = !served(needs[a.dataset.tab]) || !state.namespace; // nothing to show before one is chosen
  }
  try {
    if (!state.namespace) {
      await showNamespaces(p.page || "");
      return;
    }
    if (p.conversation) await showConversation(p.conversation, int(p.entry));
    else if (p.memory) await showMemory(p.memory);
    else if (tab === "memories") await showMemories(p.query || "");
    else if (tab === "backlog") await showBacklog(state, (error) => { stopMetrics(); failed(error); });
    else await showConversations(p.page || "");
  } catch (error) {
    failed(error);
  }
}

// -- namespaces ------------------------------------------------------------------------

// The home page: the namespaces the caller may read that hold conversations
// (ListNamespaces: among the identity's grants; every one with authentication off).
async function showNamespaces(pageToken) {
  if (!served(TRANSCRIPT)) {
    view(el("p", { class: "hint" }, "Choose a namespace to look into."));
    return;
  }
  const reply = await call(TRANSCRIPT, "ListNamespaces", { pageSize: 100, pageToken });
  const names = reply.namespaces || [];
  const list = document.getElementById("namespaces");
  for (const ns of names) {
    if (!list.querySelector(`option[value="${CSS.escape(ns)}"]`)) list.append(el("option", { value: ns }));
  }
  view(
    el("h1", {}, "Namespaces"),
    names.length
      ? el("ul", { id: "namespace-list" }, names.map((ns) =>
          el("li", { dataset: { namespace: ns } }, link({ namespace: ns }, ns))))
      : el("p", { class: "hint" }, "No namespace you may read holds a conversation yet. Type one above to open it."),
    reply.nextPageToken ? link({ page: reply.nextPageToken }, "More namespaces") : null,
  );
}

// -- conversations -------------------------------------------------------------------

// Ids are UUIDv7: their start is the time (alike for conversations made together), their
// end random, so the end tells them apart.
function shortId(id) {
  return `…${String(id).slice(-8)}`;
}

async function showConversations(pageToken) {
  const ns = state.namespace;
  const reply = await call(TRANSCRIPT, "ListConversations", {
    namespace: ns, pageSize: 50, pageToken, order: "CONVERSATION_ORDER_NEWEST_FIRST",
  });
  const rows = (reply.conversations || []).map((c) =>
    el("tr", { class: "conversation", dataset: { conversation: c.conversationId } },
      el("td", { class: "preview" },
        link({ namespace: ns, conversation: c.conversationId },
          c.preview ? el("span", { class: "text" }, c.preview) : el("span", { class: "none" }, "no user message yet")),
        " ", el("code", { class: "id", title: c.conversationId }, shortId(c.conversationId))),
      el("td", { class: "num" }, int(c.lastSequence)),
      el("td", { class: "num" }, int(c.version)),
      el("td", {}, time(c.createTime)),
      el("td", {}, time(c.updateTime)),
      el("td", { class: "labels" }, Object.entries(c.labels || {}).map(([k, v]) => el("span", { class: "label" }, `${k}=${v}`))),
    ),
  );
  view(
    el("h1", {}, "Conversations"),
    rows.length
      ? el("p", { class: "hint", id: "conversation-count" },
          `${rows.length} conversation${rows.length === 1 ? "" : "s"}${reply.nextPageToken ? " on this page" : ""}, newest first`)
      : null,
    rows.length
      ? el("table", { id: "conversations" },
          el("thead", {}, el("tr", {}, el("th", {}, "first message"), el("th", { class: "num" }, "entries"), el("th", { class: "num" }, "appends"),
            el("th", {}, "created"), el("th", {}, "updated"), el("th", {}, "labels"))),
          el("tbody", {}, rows))
      : el("p", { class: "hint" }, "No conversations in this namespace."),
    reply.nextPageToken ? link({ namespace: ns, page: reply.nextPageToken }, "Next page") : null,
  );
}

function entryNode(entry, marks) {
  const m = entry.message || {};
  const seq = int(entry.sequence);
  const classes = ["entry", `role-${roleName(m.role)}`];
  if (seq <= marks.summarizedThrough) classes.push("summarized");
  if (seq >= marks.windowFirst && marks.windowFirst > 0) classes.push("in-window");
  if (marks.highlight && seq >= marks.highlight[0] && seq <= marks.highlight[1]) classes.push("highlighted");
  const calls = (m.toolCalls || []).map((tc) =>
    el("div", { class: "tool-call" }, el("span", { class: "tool-name" }, `${tc.name || "?"}(`), el("code", {}, tc.argumentsJson || ""), ")",
      tc.id ? el("span", { class: "tool-id" }, ` id ${tc.id}`) : null));
  return el("li", { class: classes.join(" "), id: `entry-${seq}`, dataset: { sequence: seq } },
    el("div", { class: "meta" },
      el("span", { class: "seq" }, `#${seq}`),
      el("span", { class: "role" }, roleName(m.role)),
      m.toolCallId ? el("span", { class: "tool-id" }, `answers ${m.toolCallId}`) : null,
      Object.entries(m.metadata || {}).map(([k, v]) => el("span", { class: "label" }, `${k}=${v}`)),
    ),
    m.text ? el("div", { class: "text" }, m.text) : null,
    calls,
    marks.edit && m.role === "ROLE_USER" ? editControl(marks.edit, seq, m.text || "") : null,
  );
}

// "Edit and regenerate" on a user entry: the conversation is forked before it (the fork
// shares entries 1..seq-1, even when that cuts the append the entry is in: the server
// keeps that append's entries up to there) and the edited text runs as a turn on the
// fork, whose page is then shown. The source is left as it was.
function editControl(edit, seq, text) {
  const button = el("button", { type: "button", class: "edit" }, "Edit and regenerate");
  button.addEventListener("click", () => {
    const entry = document.getElementById(`entry-${seq}`);
    if (!entry || entry.querySelector("form.edit-form")) return;
    stopFollowing(); // a redraw would throw the edit away
    const input = el("textarea", { class: "edit-input", rows: 3, required: true });
    input.value = text;
    const send = el("button", { type: "submit", class: "edit-send" }, "Regenerate on a fork");
    const cancel = el("button", { type: "button", class: "edit-cancel" }, "Cancel");
    const form = el("form", { class: "edit-form" },
      el("p", { class: "hint" }, `A new conversation ${seq > 1 ? `shares entries 1–${seq - 1} with this one, then runs` : "runs"} this message as its next turn. This conversation is not changed.`),
      input, el("div", { class: "actions" }, send, cancel));
    cancel.addEventListener("click", () => route());
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const edited = input.value.trim();
      if (!edited) return;
      send.disabled = true;
      cancel.disabled = true;
      try {
        const reply = await call(TRANSCRIPT, "ForkConversation", {
          namespace: edit.ns, conversationId: edit.id, throughSequence: String(seq - 1), requestId: turnId(),
        });
        const fork = reply.conversation.conversationId;
        const turn = { conversation: fork, stages: [`forked at entry ${seq - 1}`, "sent"], text: "", done: false };
        state.lastTurn = turn;
        // The fork's page, where the turn's stages show as they arrive.
        navigate({ namespace: edit.ns, conversation: fork });
        await runTurn(edit.ns, fork, edited, turn);
      } catch (error) {
        send.disabled = false;
        cancel.disabled = false;
        failed(error);
      }
    });
    entry.append(form);
    button.hidden = true;
    input.focus();
  });
  return button;
}

async function loadEntries(ns, id, through) {
  // Pages from the start (the append markers count from the first entry), as far as
  // `through` when a link points further in; "Load more" asks for the rest.
  const entries = [];
  let pageToken = "";
  do {
    const page = await call(TRANSCRIPT, "ListEntries", { namespace: ns, conversationId: id, pageSize: PAGE, pageToken });
    entries.push(...(page.entries || []));
    pageToken = page.nextPageToken || "";
  } while (pageToken && through > 0 && int(entries[entries.length - 1]?.sequence) < through && entries.length < 100 * PAGE);
  return { entries, pageToken };
}

async function showConversation(id, entry) {
  const ns = state.namespace;
  const [conv, forks, summary, memories] = await Promise.all([
    call(TRANSCRIPT, "GetConversation", { namespace: ns, conversationId: id }),
    call(TRANSCRIPT, "ListForks", { namespace: ns, conversationId: id, pageSize: FORKS_PAGE }),
    served(SUMMARY) ? call(SUMMARY, "GetSummary", { namespace: ns, conversationId: id }) : null,
    served(MEMORY) ? call(MEMORY, "ListMemories", { namespace: ns, conversationId: id, pageSize: 100 }) : null,
  ]);
  const c = conv.conversation || {};
  const s = (summary && summary.summary) || null;
  const summarizedThrough = s ? int(s.throughSequence) : 0;
  const v = await call(TRANSCRIPT, "LoadView", {
    namespace: ns, conversationId: id, window: WINDOW, summaryBatch: 64, summarizedThrough,
  });
  const windowEntries = v.window || [];
  const windowFirst = windowEntries.length ? int(windowEntries[0].sequence) : 0;
  let highlight = null;
  if (entry > 0) {
    const through = int(params().through) || entry;
    highlight = [entry, through];
  }
  const talk = actionsOn() && served(AGENT);
  const marks = { summarizedThrough, windowFirst, highlight, edit: talk ? { ns, id } : null };
  const loaded = await loadEntries(ns, id, highlight ? highlight[1] : 0);
  const firstSequence = loaded.entries.length ? int(loaded.entries[0].sequence) : 0;

  const list = el("ol", { id: "entries" });
  let appendNo = 0;
  let lastCreated = null;
  const render = (entries) => {
    for (const e of entries) {
      const seq = int(e.sequence);
      if (e.createdAt !== lastCreated) {
        // One append writes its entries in one transaction, with one time: a new time is
        // the next append (a turn writes its input and its answer in one).
        appendNo += 1;
        lastCreated = e.createdAt;
        list.append(el("li", { class: "turn-marker" }, `append ${appendNo} · ${time(e.createdAt)}`));
      }
      // The marker goes right above the window's first entry. A window that holds the
      // whole transcript has no start to mark (the facts say so); one that reaches back
      // into the summarized part says that a turn sees those entries twice.
      if (seq === windowFirst && windowFirst > firstSequence) {
        const overlap = windowFirst <= summarizedThrough
          ? ` (entries ${windowFirst}–${summarizedThrough} of it are in the summary too)` : "";
        list.append(el("li", { class: "window-start", id: "window-start", dataset: { first: seq } },
          `last window: the ${windowEntries.length} most recent entries (window ${WINDOW}) start here${overlap}`));
      }
      list.append(entryNode(e, marks));
      if (seq === summarizedThrough) {
        list.append(el("li", { class: "boundary", id: "summary-boundary", dataset: { through: seq } },
          `summary boundary: entries 1–${seq} are covered by the summary`));
      }
    }
  };
  render(loaded.entries);
  let pageToken = loaded.pageToken;
  const more = el("button", { type: "button", id: "more-entries", hidden: !pageToken }, "Load more entries");
  more.addEventListener("click", async () => {
    try {
      const page = await call(TRANSCRIPT, "ListEntries", { namespace: ns, conversationId: id, pageSize: PAGE, pageToken });
      render(page.entries || []);
      pageToken = page.nextPageToken || "";
      more.hidden = !pageToken;
    } catch (error) {
      failed(error);
    }
  });

  const derived = ((memories && memories.memories) || []).map((mem) => el("li", { class: "memory" },
    link({ namespace: ns, memory: mem.memoryId }, el("span", { class: "memory-content" }, mem.content)),
    " ", sourcesNode(ns, mem.sources || [], id)));

  const follow = el("input", { type: "checkbox", id: "follow", checked: true });
  const actions = actionsOn()
    ? el("div", { class: "actions" },
        served(SUMMARY) && actionButton("Request summary", `Enqueue a background summary of conversation ${id}?`, () =>
          call(SUMMARY, "RequestSummary", { namespace: ns, conversationId: id, window: WINDOW, summaryBatch: 64 }).then((r) => `summary job ${r.job?.jobId || ""} queued`)),
        served(AGENT) && actionButton("Erase conversation", `Erase conversation ${id} everywhere (entries, summaries, derived memories)? This cannot be undone.`, () =>
          call(AGENT, "EraseConversation", { namespace: ns, conversationId: id }).then(() => {
            navigate({ namespace: ns });
            return "erased";
          }), "danger"))
    : null;

  view(
    el("p", { class: "crumbs" }, link({ namespace: ns }, "Conversations"), " / ", el("code", {}, id)),
    el("h1", {}, "Conversation"),
    el("dl", { class: "facts", id: "conversation-facts" },
      el("dt", {}, "version"), el("dd", { id: "conversation-version" }, int(c.version)),
      el("dt", {}, "entries"), el("dd", { id: "conversation-last-sequence" }, int(c.lastSequence)),
      el("dt", {}, "summarized through"), el("dd", { id: "summarized-through" }, summarizedThrough || "nothing yet"),
      el("dt", {}, "unsummarized outside the window"), el("dd", { id: "summary-buffer" },
        `${(v.summaryBuffer || []).length} in the next batch, ${int(v.summaryBacklog)} behind it`),
      el("dt", {}, "last window"), el("dd", { id: "window-facts" },
        windowFirst ? `entries ${windowFirst}–${int(v.lastSequence)}${windowFirst <= firstSequence ? " (the whole transcript)" : ""}` : "empty"),
      el("dt", {}, "updated"), el("dd", {}, time(c.updateTime)),
      el("dt", {}, "labels"), el("dd", {}, Object.entries(c.labels || {}).map(([k, val]) => el("span", { class: "label" }, `${k}=${val}`))),
      c.forkOrigin ? el("dt", {}, "forked from") : null,
      c.forkOrigin ? el("dd", { id: "fork-origin" }, originLink(ns, c.forkOrigin)) : null,
    ),
    el("label", { class: "follow" }, follow, " follow new entries"),
    actions,
    talk ? chatBox(ns, id) : null,
    s
      ? el("section", { class: "summary", id: "summary" },
          el("h2", {}, `Summary (revision ${int(s.revision)}, through entry ${summarizedThrough})`),
          el("div", { class: "text" }, s.text))
      : el("section", { class: "summary empty", id: "summary" },
          el("h2", {}, served(SUMMARY) ? "No summary yet" : "Summaries: SummaryService is not served on this port")),
    el("h2", {}, "Transcript"),
    list,
    more,
    forksNode(ns, id, forks),
    served(MEMORY) ? el("h2", {}, "Memories derived from it") : null,
    served(MEMORY)
      ? (derived.length ? el("ul", { id: "derived-memories" }, derived) : el("p", { class: "hint" }, "None."))
      : null,
  );
  if (highlight) {
    const target = document.getElementById(`entry-${highlight[0]}`);
    if (target) target.scrollIntoView({ block: "center" });
  }
  // Live: WatchConversation is served over gRPC only (GRPC_ONLY on this port), so the
  // version is polled and the page redrawn when it moved.
  const seen = int(c.version);
  stopFollowing(); // one timer, whichever of two overlapping draws ends last
  state.follow = setInterval(async () => {
    if (!follow.checked || document.hidden) return;
    try {
      const now = await call(TRANSCRIPT, "GetConversation", { namespace: ns, conversationId: id });
      if (int(now.conversation?.version) !== seen) route();
    } catch (error) {
      stopFollowing();
      failed(error);
    }
  }, FOLLOW_MS);
}

// -- the chat box (RUNIFOLD_CONSOLE_ACTIONS=1) ----------------------------------------

const STAGES = {
  TURN_STAGE_LOADING_CONTEXT: "loading context",
  TURN_STAGE_SUMMARIZING: "summarizing",
  TURN_STAGE_RETRIEVING_MEMORY: "retrieving memories",
  TURN_STAGE_CALLING_MODEL: "calling the model",
  TURN_STAGE_COMMITTING: "committing",
};

function chatLog(turn) {
  return el("div", {
    id: "chat-log",
    dataset: { done: turn && turn.done ? "1" : "", settled: turn && turn.settled ? "1" : "", conversation: turn ? turn.conversation : "" },
  },
    el("ol", { id: "chat-stages" }, (turn ? turn.stages : []).map((stage, i) =>
      el("li", { class: turn.done || i < turn.stages.length - 1 ? "done" : "" }, stage))),
    turn && turn.text ? el("div", { id: "chat-answer", class: "text" }, turn.text) : null);
}

// The turn's stages, redrawn in the chat box of its conversation's page when that page
// is the one shown.
function redrawTurn(turn) {
  const log = document.getElementById("chat-log");
  if (log && log.dataset.conversation === turn.conversation) log.replaceWith(chatLog(turn));
}

// A turn through StreamConversation over Connect: each stage and each piece of the
// model's text shown as it arrives; on the result the page of its conversation, if
// shown, is drawn again with the new entries. Throws what failed.
async function runTurn(ns, id, text, turn) {
  stopFollowing(); // the result redraws the page
  redrawTurn(turn);
  try {
    await stream(AGENT, "StreamConversation",
      { namespace: ns, conversationId: id, input: [{ role: "ROLE_USER", text }], turnId: turnId() },
      (event) => {
        if (event.progress) turn.stages.push(STAGES[event.progress.stage] || String(event.progress.stage));
        if (event.textDelta) turn.text += event.textDelta.text || "";
        if (event.result) {
          turn.stages.push(`committed (version ${int(event.result.conversationVersion)})`);
          turn.done = true;
        }
        redrawTurn(turn);
      });
  } catch (error) {
    turn.stages.push("failed");
    redrawTurn(turn);
    throw error;
  }
  // Drawn again with the new entries; `settled` then marks the page as final.
  if (params().conversation === id) await route();
  turn.settled = true;
  redrawTurn(turn);
}

function chatBox(ns, id) {
  const input = el("textarea", { id: "chat-input", rows: 2, placeholder: "Say something to this conversation", required: true });
  const send = el("button", { type: "submit", id: "chat-send" }, "Send");
  const form = el("form", { id: "chat-form" }, input, send);
  const shown = state.lastTurn && state.lastTurn.conversation === id ? state.lastTurn : null;
  // A turn still running here (one sent from an edit, say) takes the box until it ends.
  send.disabled = Boolean(shown && !shown.done && shown.stages[shown.stages.length - 1] !== "failed");
  const box = el("section", { class: "chat", id: "chat" }, el("h2", {}, "Talk to it"), form, chatLog(shown));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = input.value.trim();
    if (!text) return;
    send.disabled = true;
    const turn = { conversation: id, stages: ["sent"], text: "", done: false };
    state.lastTurn = turn;
    try {
      await runTurn(ns, id, text, turn);
      input.value = "";
    } catch (error) {
      send.disabled = false;
      failed(error);
    }
  });
  return box;
}

// Where a fork came from: its source, opened at the fork point's entry.
function originLink(ns, origin) {
  const through = int(origin.throughSequence);
  const at = { namespace: ns, conversation: origin.conversationId };
  return link(through ? { ...at, entry: through } : at,
    el("code", { title: origin.conversationId }, shortId(origin.conversationId)),
    through ? ` after entry ${through}` : " before its first entry");
}

// The forks made of this conversation, and theirs (ListForks' first page), in the order
// they were made.
function forksNode(ns, id, reply) {
  const forks = reply.forks || [];
  return el("section", { class: "forks", id: "forks" },
    el("h2", {}, "Forks"),
    forks.length
      ? el("ul", { id: "fork-list" }, forks.map((f) => {
          const through = int(f.throughSequence);
          return el("li", { class: "fork", dataset: { conversation: f.conversationId } },
            link({ namespace: ns, conversation: f.conversationId }, el("code", { title: f.conversationId }, shortId(f.conversationId))),
            through ? ` shares entries 1–${through}` : " shares no entry",
            f.sourceConversationId === id ? "" : ` of `,
            f.sourceConversationId === id ? null : link({ namespace: ns, conversation: f.sourceConversationId },
              el("code", { title: f.sourceConversationId }, shortId(f.sourceConversationId))),
            f.sourceConversationId === id ? "" : " (a fork of a fork)");
        }))
      : el("p", { class: "hint" }, "None."),
    reply.nextPageToken ? el("p", { class: "hint", id: "more-forks" }, `The first ${forks.length} forks are shown.`) : null);
}

function actionButton(label, question, run, kind = "") {
  const button = el("button", { type: "button", class: `action ${kind}` }, label);
  button.addEventListener("click", async () => {
    if (!window.confirm(question)) return;
    try {
      status(await run());
    } catch (error) {
      failed(error);
    }
  });
  return button;
}

function sourcesNode(ns, sources, current) {
  return el("span", { class: "sources" }, sources.map((src) => {
    // A source outside the transcript: its URI as text, never a link (any scheme is
    // accepted, javascript: included).
    if (src.externalUri) return el("span", { class: "source external", title: "external source" }, src.externalUri);
    const from = int(src.fromSequence);
    const through = int(src.throughSequence) || from;
    const label = `${src.conversationId === current ? "" : src.conversationId.slice(0, 8) + "… "}entries ${from}–${through}`;
    return el("span", { class: "source" },
      link({ namespace: ns, conversation: src.conversationId, entry: from, through }, label));
  }));
}

// -- memories ---------------------------------------------------------------------------

function memoryRow(ns, mem, score) {
  return el("li", { class: "memory", dataset: { memory: mem.memoryId } },
    el("div", {}, link({ namespace: ns, memory: mem.memoryId }, el("span", { class: "memory-content" }, mem.content))),
    el("div", { class: "meta" },
      score !== undefined ? el("span", { class: "score" }, `score ${Number(score).toFixed(3)}`) : null,
      el("span", {}, `revision ${int(mem.revision)}`),
      mem.expireTime ? el("span", {}, `expires ${time(mem.expireTime)}`) : null,
      el("span", {}, "from "), sourcesNode(ns, mem.sources || [], null)));
}

async function showMemories(query) {
  const ns = state.namespace;
  const form = el("form", { id: "search-form", class: "search" },
    el("input", { id: "query", name: "query", placeholder: "search memories (semantic)", value: query }),
    el("button", { type: "submit" }, "Search"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    navigate({ namespace: ns, tab: "memories", query: form.query.value.trim() });
  });
  let list;
  if (query) {
    const found = await call(MEMORY, "SearchMemories", { namespace: ns, query, limit: 20 });
    list = (found.results || []).map((r) => memoryRow(ns, r.memory || {}, r.score || 0));
    if (found.degraded) status("the vector index is unreachable: full-text results");
  } else {
    const listed = await call(MEMORY, "ListMemories", { namespace: ns, pageSize: 100 });
    list = (listed.memories || []).map((m) => memoryRow(ns, m));
  }
  view(el("h1", {}, "Memories"), form,
    list.length ? el("ul", { id: "memories" }, list) : el("p", { class: "hint" }, "No memories."));
}

async function showMemory(id) {
  const ns = state.namespace;
  const reply = await call(MEMORY, "GetMemory", { namespace: ns, memoryId: id });
  const m = reply.memory || {};
  const actions = actionsOn()
    ? el("div", { class: "actions" }, actionButton("Delete memory", `Delete memory ${id}?`, () =>
        call(MEMORY, "DeleteMemory", { namespace: ns, memoryId: id, expectedRevision: m.revision }).then(() => {
          navigate({ namespace: ns, tab: "memories" });
          return "deleted";
        }), "danger"))
    : null;
  view(
    el("p", { class: "crumbs" }, link({ namespace: ns, tab: "memories" }, "Memories"), " / ", el("code", {}, id)),
    el("h1", {}, "Memory"),
    el("section", { class: "memory-detail", id: "memory" }, el("div", { class: "text memory-content" }, m.content)),
    el("dl", { class: "facts" },
      el("dt", {}, "revision"), el("dd", {}, int(m.revision)),
      el("dt", {}, "sources"), el("dd", { id: "memory-sources" }, sourcesNode(ns, m.sources || [], null)),
      el("dt", {}, "created"), el("dd", {}, time(m.createTime)),
      el("dt", {}, "updated"), el("dd", {}, time(m.updateTime)),
      el("dt", {}, "expires"), el("dd", {}, m.expireTime ? time(m.expireTime) : "never"),
      el("dt", {}, "metadata"), el("dd", {}, Object.entries(m.metadata || {}).map(([k, v]) => el("span", { class: "label" }, `${k}=${v}`))),
      el("dt", {}, "embedding"), el("dd", {}, `${m.embeddingModel || ""} (${m.embeddingDimension || 0})`),
    ),
    actions,
  );
}

// -- session, sign-in, namespaces ------------------------------------------------------

function showSignIn(message) {
  document.getElementById("sign-in").hidden = false;
  document.getElementById("sign-in-error").textContent = message || "";
}

async function loadSession() {
  const session = await getJson("console/api/session");
  state.session = session;
  const who = document.getElementById("who");
  const list = document.getElementById("namespaces");
  list.replaceChildren();
  document.getElementById("sign-out").hidden = !token();
  if (session.auth === "none") {
    who.textContent = "authentication off";
  } else if (session.identity) {
    const id = session.identity;
    who.textContent = id.all ? `${id.subject}: every namespace` : `${id.subject}: ${id.namespaces.length} namespace(s)`;
    for (const ns of id.namespaces) list.append(el("option", { value: ns }));
    document.getElementById("sign-in").hidden = true;
    if (!params().namespace && id.namespaces.length === 1 && !id.all) {
      navigate({ namespace: id.namespaces[0] }, true);
      return session;
    }
  } else {
    who.textContent = "not signed in";
    showSignIn(session.identity_error ? session.identity_error.message : "");
  }
  return session;
}

function wire() {
  document.getElementById("namespace-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const ns = document.getElementById("namespace").value.trim();
    if (ns) navigate({ namespace: ns });
  });
  for (const a of document.querySelectorAll("#tabs a")) {
    a.addEventListener("click", (event) => {
      event.preventDefault();
      navigate({ namespace: state.namespace, tab: a.dataset.tab });
    });
  }
  document.getElementById("token-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    setToken(document.getElementById("token").value.trim());
    document.getElementById("token").value = "";
    await start();
  });
  document.getElementById("sign-out").addEventListener("click", async () => {
    setToken("");
    await start();
  });
}

async function start() {
  try {
    await loadSession();
  } catch (error) {
    failed(error);
    return;
  }
  await route();
}

wire();
start();
