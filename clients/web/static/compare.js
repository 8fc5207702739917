// The same text through every translator, side by side: each panel shows one model's output and its
// attention matrix, so a room can see where two architectures differ.
import { matrixTable } from "./matrix.js";

export function showComparison(container, results) {
  container.replaceChildren(...results.map(({ model, result, error }) => {
    const panel = document.createElement("div");
    panel.className = "panel";
    panel.dataset.model = model;
    const title = document.createElement("h3");
    title.textContent = model;
    panel.append(title);
    if (error) {
      const message = document.createElement("p");
      message.className = "panel-error";
      message.textContent = error.message;
      panel.append(message);
      return panel;
    }
    const output = document.createElement("p");
    output.className = "panel-output";
    output.textContent = result.text;
    const table = document.createElement("table");
    table.className = "matrix";
    matrixTable(table, result.attention, result.attention.col_labels);
    const scroll = document.createElement("div");
    scroll.className = "scroll";
    scroll.append(table);
    panel.append(output, scroll);
    return panel;
  }));
}
