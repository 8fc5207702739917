// The full attention matrix as a table (one row per output word, one column per source column, the weight
// printed in each cell and shaded relative to its row's largest), its legend, and a PNG of the view.

const SHADE = "230, 90, 20";

export function matrixTable(table, attention, columnLabels) {
  const head = document.createElement("tr");
  head.append(cell("th", ""), ...columnLabels.map((label) => cell("th", label, { scope: "col" })));
  const rows = attention.weights.map((row, i) => {
    const tr = document.createElement("tr");
    tr.dataset.row = i;
    const peak = Math.max(...row) || 1;
    tr.append(cell("th", attention.row_labels[i], { scope: "row" }));
    row.forEach((w, j) => {
      const td = cell("td", w.toFixed(2));
      td.dataset.col = j;
      td.style.setProperty("--w", (w / peak).toFixed(3));
      td.classList.toggle("dark", w / peak > 0.55); // light text where the shade is dark
      tr.append(td);
    });
    return tr;
  });
  table.replaceChildren(head, ...rows);
}

export function legend(element) {
  const bar = document.createElement("span");
  bar.className = "legend-bar";
  const low = document.createElement("span");
  low.textContent = "0";
  const high = document.createElement("span");
  high.textContent = "row's largest";
  const note = document.createElement("span");
  note.className = "muted";
  note.textContent = "numbers: attention weight (each row sums to 1 over the source)";
  element.replaceChildren(low, bar, high, note);
}

export function markRow(table, i) {
  for (const tr of table.querySelectorAll("tr[data-row]")) tr.classList.toggle("active", tr.dataset.row === String(i));
}

function cell(tag, text, attributes = {}) {
  const element = document.createElement(tag);
  element.textContent = text;
  for (const [name, value] of Object.entries(attributes)) element.setAttribute(name, value);
  return element;
}

// A PNG of the output, the source and the matrix, drawn on a canvas (large type: it goes on slides).
export async function exportPng(result, columnLabels, title) {
  const attention = result.attention;
  const cellW = 64, cellH = 40, font = 20;
  const labelW = 40 + 12 * Math.max(...attention.row_labels.map((l) => l.length));
  const headH = 40 + 12 * Math.min(12, Math.max(...columnLabels.map((l) => l.length)));
  const canvas = document.createElement("canvas");
  canvas.width = labelW + cellW * columnLabels.length + 20;
  canvas.height = 60 + headH + cellH * attention.row_labels.length + 20;
  const g = canvas.getContext("2d");
  g.fillStyle = "#fff";
  g.fillRect(0, 0, canvas.width, canvas.height);
  g.fillStyle = "#111";
  g.font = `bold ${font + 4}px system-ui, "Noto Sans CJK TC", sans-serif`;
  g.fillText(title, 10, 34);
  g.font = `${font}px system-ui, "Noto Sans CJK TC", sans-serif`;
  columnLabels.forEach((label, j) => {
    g.save();
    g.translate(labelW + j * cellW + cellW / 2, 60 + headH - 8);
    g.rotate(-Math.PI / 4);
    g.fillText(label.slice(0, 12), 0, 0);
    g.restore();
  });
  attention.weights.forEach((row, i) => {
    const y = 60 + headH + i * cellH;
    const peak = Math.max(...row) || 1;
    g.fillStyle = "#111";
    g.fillText(attention.row_labels[i], 10, y + cellH * 0.7);
    row.forEach((w, j) => {
      g.fillStyle = `rgba(${SHADE}, ${w / peak})`;
      g.fillRect(labelW + j * cellW, y, cellW - 2, cellH - 2);
      g.fillStyle = w / peak > 0.55 ? "#fff" : "#111";
      g.fillText(w.toFixed(2), labelW + j * cellW + 8, y + cellH * 0.68);
    });
  });
  const blob = await new Promise((resolve) => canvas.toBlob(resolve, "image/png"));
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = `attention-${result.model}.png`;
  document.body.append(link);
  link.click();
  link.remove();
  return blob;
}
