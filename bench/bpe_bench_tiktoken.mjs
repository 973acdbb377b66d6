// bpe_bench_tiktoken.mjs: the npm package tiktoken on the same text as
// build/bpe_bench encode (one thread: Node runs the WASM on its main thread).
//   NODE_PATH=/tmp/tk/node_modules node bench/bpe_bench_tiktoken.mjs NAME TEXT [IDS_OUT]
import { createRequire } from "node:module";
import { readFileSync, writeFileSync } from "node:fs";
import path from "node:path";

const require = createRequire(path.join(process.env.NODE_PATH || ".", "x.js"));
const { get_encoding } = require("tiktoken");
const [name, file, idsOut] = process.argv.slice(2);
const enc = get_encoding(name);
const text = readFileSync(file, "utf8");
const bytes = Buffer.byteLength(text);
const secs = [];
let ids;
for (let r = 0; r < 5; r++) {
  const t0 = process.hrtime.bigint();
  ids = enc.encode_ordinary(text);
  secs.push(Number(process.hrtime.bigint() - t0) / 1e9);
}
secs.sort((a, b) => a - b);
const version = JSON.parse(readFileSync(path.join(process.env.NODE_PATH || "node_modules", "tiktoken/package.json"))).version;
console.log(`tiktoken (npm ${version}) ${name} ${file}: ${bytes} bytes -> ` +
  `${ids.length} tokens, ${secs[2].toFixed(3)} s, ${(bytes / secs[2] / 1e6).toFixed(2)} MB/s (median of 5)`);
if (idsOut) writeFileSync(idsOut, Array.from(ids).join(" ") + "\n");
