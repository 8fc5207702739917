// Translates a sentence through a running gateway and prints which source word each output word looked at.
//
//     attnserve serve --models models/ &   attnserve web --port 8080 &
//     cd clients/js && npm ci && npm run build && node examples/translate.mjs http://127.0.0.1:8080 "知識就是力量"
import { AttnServeClient, attentionRows } from "../dist/src/index.js";

const [url = "http://127.0.0.1:8080", text = "知識就是力量。", model = "translate-zh-en"] = process.argv.slice(2);
const client = new AttnServeClient(url, { token: process.env.ATTNSERVE_TOKEN });
const result = await client.translate(text, { model, attention: true });
console.log(`${result.text}  (${result.targetLanguage}, ${result.finishReason})`);
const { rowLabels, colLabels } = result.attention;
attentionRows(result).forEach((row, r) => {
  const best = row.indexOf(Math.max(...row));
  console.log(`  ${rowLabels[r].padEnd(14)} <- ${colLabels[best]} (${row[best].toFixed(2)})`);
});
