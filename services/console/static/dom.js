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

export function chart(name, label, points) {
  const w = 220, h = 48;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("class", "spark");
  const max = Math.max(1, ...points);
  // The newest point at the right edge, HISTORY points across; a single point (the page
  // just opened) is drawn as a level line across.
  const shown = points.length === 1 ? [points[0], points[0]] : points;
  const step = points.length === 1 ? w : w / (HISTORY - 1);
  const line = document.createElementNS(SVG, "polyline");
  line.setAttribute("points", shown.map((p, i) => {
    const x = w - (shown.length - 1 - i) * step;
    return `${x.toFixed(1)},${(h - 2 - (p / max) * (h - 4)).toFixed(1)}`;
  }).join(" "));
  svg.append(line);
  const last = points[points.length - 1] || 0;
  return el("figure", { class: "chart", dataset: { series: name } },
    svg, el("figcaption", {}, el("span", { class: "value" }, Number.isInteger(last) ? last : last.toFixed(1)), " ", label));
}
