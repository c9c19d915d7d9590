// llama.cpp as a peer of pyforge's decoder, through node-llama-cpp's prebuilt cpu binaries
// (nothing to compile): greedy decode from given token ids, timed around the binding's calls.
//
//   npm i -E node-llama-cpp@3.21.1            (once, in a folder DIR outside the repo)
//   node benchmarks/llama_node.mjs DIR MODEL.gguf THREADS
//
// Loads the model once, prints {"ready": build}, then answers each stdin line {"ids": [...],
// "new": N} with one line [prefill ms, decode ms per token, greedy token ids], so a caller can
// alternate it call by call with other peers. prefill = the prompt up to the first token;
// decode = each later token alone, averaged. The cache is cleared before each request.
import { join } from "node:path";
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";

const [dir, modelPath, threadsArg] = process.argv.slice(2);
const lib = await import(pathToFileURL(join(dir, "node_modules/node-llama-cpp/dist/index.js")));
const llama = await lib.getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
const context = await model.createContext({
  contextSize: 2048,
  batchSize: 512,
  threads: Number(threadsArg),
  sequences: 1,
});
const sequence = context.getSequence();

async function run(ids, steps) {
  await sequence.clearHistory();
  const tokens = [];
  let t0 = performance.now();
  let prefill = 0;
  const gen = sequence.evaluate(ids, { temperature: 0 });
  for (let i = 0; i < steps; i++) {
    const { value, done } = await gen.next();
    if (done) break;
    tokens.push(value);
    if (i === 0) {
      prefill = performance.now() - t0;
      t0 = performance.now();
    }
  }
  const decode = (performance.now() - t0) / Math.max(1, tokens.length - 1);
  await gen.return();
  return [prefill, decode, tokens];
}

console.log(JSON.stringify({ ready: `llama.cpp ${llama.llamaCppRelease.release}, cpu` }));
for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  const { ids, new: steps } = JSON.parse(line);
  console.log(JSON.stringify(await run(ids, steps)));
}
await context.dispose();
await model.dispose();
