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
import { checker, importOpenAI, KEY, startKvpd, stopKvpd, synthQwen3, validate } from "./lib.mjs";

const check = checker("structured");
const OpenAI = await importOpenAI("structured");

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

async function main() {
  const { model, dir } = synthQwen3("kvp-structured-");
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
    const code = await stopKvpd(k, dir);
    check(code === 0, `kvpd exited 0 on SIGTERM (${code})`);
  }
}

await main();
