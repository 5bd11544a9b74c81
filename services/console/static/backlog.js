// The summary backlog view: the namespace's job queue, and this server's own counters
// charted over the last HISTORY refreshes (process-wide: no tenant data).

import { SUMMARY, call, getJson, int } from "./api.js";
import { HISTORY, chart, el, view } from "./dom.js";

const METRICS_MS = 5000;

// Each series: its name, what it counts and its unit (counters: since the process started).
const SERIES = [
  ["summary_jobs_depth", "summary jobs waiting (all namespaces)", "jobs"],
  ["summary_jobs_oldest_age_seconds", "oldest waiting job (all namespaces)", "s"],
  ["append_conflicts_total", "append conflicts (VERSION_CONFLICT) since start", "appends"],
  ["turn_conflicts_total", "turn conflicts (TURN_CONFLICT) since start", "turns"],
  ["turn_busy_refusals_total", "busy refusals (CONVERSATION_BUSY) since start", "calls"],
  ["summary_required_total", "turns that needed a summary, since start", "turns"],
  ["requests_shed_total", "requests shed (limits, overload) since start", "calls"],
  ["memory_outbox_depth", "memory index outbox", "memories"],
];

function seconds(duration) {
  // proto3 JSON Duration: "12.5s".
  return duration ? Number(String(duration).replace(/s$/, "")) : 0;
}

// The view of `state.namespace`'s backlog; `state.metrics` holds the charts' timer, which
// `failedTick` stops (with the error) when a refresh fails.
export async function showBacklog(state, failedTick) {
  const ns = state.namespace;
  const b = await call(SUMMARY, "GetBacklog", { namespace: ns });
  const charts = el("div", { class: "charts", id: "charts" });
  view(
    el("h1", {}, "Summary backlog"),
    el("dl", { class: "facts", id: "backlog" },
      el("dt", {}, "jobs waiting or running"), el("dd", { id: "backlog-depth" }, int(b.depth)),
      el("dt", {}, "running"), el("dd", { id: "backlog-running" }, int(b.runningCount)),
      el("dt", {}, "oldest pending"), el("dd", { id: "backlog-oldest" }, `${seconds(b.oldestPendingAge).toFixed(1)} s`),
      el("dt", {}, "failed"), el("dd", { id: "backlog-failed" }, int(b.failedCount)),
    ),
    el("h2", {}, "This server's counters"),
    el("p", { class: "hint" }, "Process-wide, every namespace together (no tenant data); a point every 5 s, the last 5 minutes."),
    charts,
  );
  const tick = async () => {
    try {
      const m = await getJson("console/api/metrics");
      for (const [name] of SERIES) {
        const points = (state.history[name] = state.history[name] || []);
        points.push(Number(m.values[name] || 0));
        if (points.length > HISTORY) points.shift();
      }
      charts.replaceChildren(...SERIES.map(([name, label, unit]) => chart(name, label, state.history[name], unit, METRICS_MS / 1000)));
    } catch (error) {
      failedTick(error);
    }
  };
  await tick();
  state.metrics = setInterval(tick, METRICS_MS);
}
