// Browser audio -> a WAV file the server reads: mono 16-bit PCM.
// A recording (MediaRecorder gives WebM/Opus or similar) is decoded by the browser, mixed down and
// resampled with an OfflineAudioContext, then written with a 44-byte RIFF header.

export const RATE = 16000; // Hz; the server resamples any common rate, this one keeps uploads small

export async function blobToWav(blob, rate = RATE) {
  const decoded = await new AudioContext().decodeAudioData(await blob.arrayBuffer());
  const frames = Math.max(1, Math.ceil(decoded.duration * rate));
  const offline = new OfflineAudioContext(1, frames, rate); // one channel: the inputs are mixed down
  const source = offline.createBufferSource();
  source.buffer = decoded;
  source.connect(offline.destination);
  source.start();
  const rendered = await offline.startRendering();
  return new Blob([encodeWav(rendered.getChannelData(0), rate)], { type: "audio/wav" });
}

export function encodeWav(samples, rate) {
  const view = new DataView(new ArrayBuffer(44 + samples.length * 2));
  const text = (at, s) => [...s].forEach((c, k) => view.setUint8(at + k, c.charCodeAt(0)));
  text(0, "RIFF");
  view.setUint32(4, 36 + samples.length * 2, true);
  text(8, "WAVE");
  text(12, "fmt ");
  view.setUint32(16, 16, true); // fmt chunk size
  view.setUint16(20, 1, true); // PCM
  view.setUint16(22, 1, true); // mono
  view.setUint32(24, rate, true);
  view.setUint32(28, rate * 2, true); // bytes per second
  view.setUint16(32, 2, true); // bytes per frame
  view.setUint16(34, 16, true); // bits per sample
  text(36, "data");
  view.setUint32(40, samples.length * 2, true);
  samples.forEach((x, k) => {
    const clipped = Math.max(-1, Math.min(1, x));
    view.setInt16(44 + k * 2, Math.round(clipped * 32767), true);
  });
  return view.buffer;
}
