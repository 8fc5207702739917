// The interactive attention view: output words above, what they looked at below (source words, a time
// line of the audio, cells over the image, or a clip's frames). Hovering output word i shades column j by
// weights[i][j] relative to the row's largest weight, and for audio marks the word's time span; for a clip it
// draws the word's timeline (its attention per frame) and shows its most-attended frame with its heatmap.

const $ = (id) => document.getElementById(id);

export function show(result, image) {
  const attention = result.attention;
  const kind = result.columns ? result.columns.kind : "none";
  const rows = attention ? attention.row_labels : result.tokens.map((t) => t.piece);
  $("output").replaceChildren(...rows.map((label, i) => word(label, { row: i })));
  $("source").replaceChildren();
  $("columns").replaceChildren();
  $("cells").replaceChildren();
  $("source").hidden = $("source-heading").hidden = kind !== "text";
  $("timeline").hidden = kind !== "time";
  $("picture").hidden = kind !== "grid";
  $("clip").hidden = kind !== "frames";
  $("span-mark").style.display = "none";
  $("reduction").textContent = attention ? attention.reduction : "";

  let columns = [];
  if (kind === "text") {
    columns = attention.col_labels.map((label, j) => word(label, { col: j }));
    $("source").replaceChildren(...columns);
  } else if (kind === "time") {
    columns = timeColumns(result.columns.spans);
    $("columns").replaceChildren(...columns);
  } else if (kind === "grid") {
    $("image").src = image.url;
    columns = gridCells(result.columns.boxes, image.width, image.height);
    $("cells").replaceChildren(...columns);
  } else if (kind === "frames") {
    columns = showClip(result.columns, image);
  }
  if (!attention) return;
  if (kind === "frames") {
    for (const [i, element] of [...$("output").children].entries()) {
      element.addEventListener("mouseenter", () => highlightFrames(i, result.frames[i], columns));
    }
    return;
  }
  const end = kind === "time" ? result.columns.spans.at(-1)[1] : 0;
  for (const [i, element] of [...$("output").children].entries()) {
    element.addEventListener("mouseenter", () => highlight(i, attention.weights[i], columns, result.words[i], end));
  }
}

function word(label, data) {
  const span = document.createElement("span");
  span.textContent = label;
  Object.assign(span.dataset, data);
  if ("col" in data) {
    span.classList.add("column");
    span.dataset.weight = "0";
  }
  return span;
}

function timeColumns(spans) {
  const end = spans.at(-1)[1];
  return spans.map(([start, stop], j) => {
    const cell = positioned({ left: start / end, width: (stop - start) / end });
    cell.title = `${start.toFixed(2)}–${stop.toFixed(2)} s`;
    cell.dataset.col = j;
    return cell;
  });
}

function gridCells(boxes, width, height) {
  return boxes.map(([x0, y0, x1, y1], j) => {
    const cell = positioned({ left: x0 / width, top: y0 / height, width: (x1 - x0) / width, height: (y1 - y0) / height });
    cell.dataset.col = j;
    return cell;
  });
}

function positioned(fractions) {
  const cell = document.createElement("div");
  cell.classList.add("column");
  cell.dataset.weight = "0";
  for (const [side, fraction] of Object.entries(fractions)) cell.style[side] = `${(fraction * 100).toFixed(3)}%`;
  return cell;
}

function highlight(i, row, columns, timing, end) {
  for (const element of $("output").children) element.classList.toggle("active", element.dataset.row === String(i));
  const peak = Math.max(...row) || 1;
  columns.forEach((element, j) => {
    element.dataset.weight = row[j].toFixed(4);
    element.style.setProperty("--w", (row[j] / peak).toFixed(3));
  });
  const mark = $("span-mark");
  if (timing && end) {
    mark.style.left = `${((timing.start_seconds / end) * 100).toFixed(3)}%`;
    mark.style.width = `${(((timing.end_seconds - timing.start_seconds) / end) * 100).toFixed(3)}%`;
    mark.style.display = "block";
  } else {
    mark.style.display = "none";
  }
}

// A clip: one bar per sampled frame (the timeline) and the frame itself (the video seeked to its time, or
// the animated GIF) under one frame's grid of cells. Returns {bars, cells} for highlightFrames.
function showClip(columns, media) {
  const video = $("clip-video");
  $("clip-gif").hidden = !media.gif;
  video.hidden = media.gif;
  if (media.gif) $("clip-gif").src = media.url;
  else video.src = media.url;
  const bars = columns.times.map((t) => {
    const bar = document.createElement("div");
    bar.title = `${t.toFixed(2)} s`;
    return bar;
  });
  const cells = gridCells(columns.boxes, media.width, media.height);
  $("frame-bars").replaceChildren(...bars);
  $("frame-cells").replaceChildren(...cells);
  return { bars, cells };
}

function highlightFrames(i, frame, { bars, cells }) {
  for (const element of $("output").children) element.classList.toggle("active", element.dataset.row === String(i));
  const most = Math.max(...frame.timeline) || 1;
  bars.forEach((bar, t) => {
    bar.style.height = `${((frame.timeline[t] / most) * 100).toFixed(1)}%`;
    bar.classList.toggle("peak", t === frame.peak_frame);
  });
  const peak = Math.max(...frame.heatmap) || 1;
  cells.forEach((cell, j) => {
    cell.dataset.weight = frame.heatmap[j].toFixed(4);
    cell.style.setProperty("--w", (frame.heatmap[j] / peak).toFixed(3));
  });
  const seconds = frame.frame_seconds[frame.peak_frame];
  if (!$("clip-video").hidden) $("clip-video").currentTime = seconds;
  $("frame-label").textContent = `${frame.word}: frame ${frame.peak_frame + 1} of ${frame.timeline.length} ` +
    `(${seconds.toFixed(2)} s), ${(frame.timeline[frame.peak_frame] * 100).toFixed(0)}% of its attention`;
}
