// The console's DOM helpers: every node built from text (textContent, never innerHTML),
// links only to this console's own query strings, and the small charts of the backlog.

export const HISTORY = 60; // points per chart

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "onclick") node.addEventListener("click", value);
    else if (key === "href") node.setAttribute("href", safeHref(value));
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// Only links of this console (a query string), never a scheme a text could smuggle in.
function safeHref(value) {
  return String(value).startsWith("?") ? value : "#";
}

export function view(...children) {
  const main = document.getElementById("view");
  main.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  return main;
}

export function status(text, isError = false) {
  const node = document.getElementById("status");
  node.textContent = text || "";
  node.className = isError ? "error" : "";
}

export function time(value) {
  if (!value) return "";
  const date = new Date(value);
  return isNaN(date) ? String(value) : date.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export function roleName(role) {
  return String(role || "ROLE_UNSPECIFIED").replace(/^ROLE_/, "").toLowerCase();
}

const SVG = "http://www.w3.org/2000/svg";

function svgNode(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

function shortNumber(value) {
  if (value >= 1e6) return `${(value / 1e6).toFixed(1)}M`;
  if (value >= 1e4) return `${Math.round(value / 1e3)}k`;
  return Number.isInteger(value) ? String(value) : value.toFixed(1);
}

// A small line chart of the last HISTORY points, one every `everyS` seconds, the newest
// at the right edge: a y axis from 0 to the largest value shown, in `unit`, and an x
// axis of time before now.
export function chart(name, label, points, unit, everyS) {
  const w = 260, h = 96, left = 38, right = 6, top = 8, bottom = 18;
  const plotW = w - left - right, plotH = h - top - bottom;
  const svg = svgNode("svg", { viewBox: `0 0 ${w} ${h}`, class: "spark" });
  const max = Math.max(1, ...points);
  const y = (v) => top + plotH - (v / max) * plotH;
  // Axes: the y axis's 0 and maximum in the unit, the x axis's span and now.
  svg.append(svgNode("line", { class: "axis", x1: left, y1: top, x2: left, y2: top + plotH }));
  svg.append(svgNode("line", { class: "axis", x1: left, y1: top + plotH, x2: left + plotW, y2: top + plotH }));
  svg.append(svgNode("line", { class: "grid", x1: left, y1: top, x2: left + plotW, y2: top }));
  svg.append(svgNode("text", { class: "tick y-max", x: left - 4, y: top + 4, "text-anchor": "end" }, shortNumber(max)));
  svg.append(svgNode("text", { class: "tick y-min", x: left - 4, y: top + plotH, "text-anchor": "end" }, "0"));
  svg.append(svgNode("text", { class: "tick unit", x: 2, y: top + plotH / 2 + 3 }, unit));
  const spanS = (HISTORY - 1) * everyS;
  const span = spanS >= 60 ? `−${Math.round(spanS / 60)} min` : `−${spanS} s`;
  svg.append(svgNode("text", { class: "tick x-min", x: left, y: h - 4 }, span));
  svg.append(svgNode("text", { class: "tick x-max", x: left + plotW, y: h - 4, "text-anchor": "end" }, "now"));
  // A single point (the page just opened) is drawn as a level line across.
  const shown = points.length === 1 ? [points[0], points[0]] : points;
  const step = points.length === 1 ? plotW : plotW / (HISTORY - 1);
  svg.append(svgNode("polyline", {
    points: shown.map((p, i) => `${(left + plotW - (shown.length - 1 - i) * step).toFixed(1)},${y(p).toFixed(1)}`).join(" "),
  }));
  const last = points[points.length - 1] || 0;
  return el("figure", { class: "chart", dataset: { series: name, unit } },
    svg, el("figcaption", {}, el("span", { class: "value" }, shortNumber(last)), ` ${unit} · ${label}`));
}
