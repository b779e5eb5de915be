// The official `openai` SDK (pinned in package.json) against kvpd's Responses API and
// text completions, with the SDK's own model names: client.responses.create whole and
// streamed (the SDK's stream helper must see its event sequence and build the final
// response), a three-turn chain through previous_response_id whose
// usage.input_tokens_details.cached_tokens grows while only the new input is prefilled,
// retrieve and delete, and client.completions.create whole and streamed, a prompt that
// extends an earlier one reusing its cache. Exits non-zero on any failure.
//
//   KVP_BUILD=build node tests/openai/responses.mjs      (meson test --suite openai runs it)
import { join } from "node:path";
import { checker, importOpenAI, shared, spawnKvpd } from "./lib.mjs";

const KEY = "sdk-responses-key";
const check = checker("responses");
const OpenAI = await importOpenAI("responses");

// kvpd on stories260K with its own API key; greedy.
const startKvpd = () => spawnKvpd([
  "--listen", "127.0.0.1:0", "--model", join(shared, "models", "stories260K.bin"),
  "--tokenizer", join(shared, "models", "tok512.bin"), "--state-dir", "",
  "--workers", "2", "--budget", "64", "--chunk", "16",
  "--temperature", "0", "--max-tokens", "64", "--api-key", KEY,
]);

async function main() {
  const k = await startKvpd();
  const exited = new Promise((res) => k.proc.on("exit", (code) => res(code)));
  try {
    // No /v1 in the base URL: the paths are served without it too.
    const client = new OpenAI({ baseURL: `http://127.0.0.1:${k.port}`, apiKey: KEY, maxRetries: 0 });
    const model = "gpt-4o-mini";   // the SDK's usual default: served by the one model

    // A three-turn chain, the second turn streamed.
    const r1 = await client.responses.create({ model, input: "Once upon a time", max_output_tokens: 12 });
    check(r1.object === "response" && r1.id.startsWith("resp_") && r1.output_text.length > 0,
          `turn 1 replied: ${JSON.stringify(r1.output_text)}`);
    check(r1.usage.input_tokens_details.cached_tokens === 0, "turn 1: nothing cached");
    check(r1.model !== model, `the response names the real model (${r1.model})`);

    const stream = await client.responses.create({
      model, input: [{ role: "user", content: " Then the sun" }], previous_response_id: r1.id,
      max_output_tokens: 12, stream: true,
    });
    const types = [];
    let text = "", r2 = null;
    for await (const ev of stream) {
      types.push(ev.type);
      if (ev.type === "response.output_text.delta") text += ev.delta;
      if (ev.type === "response.completed" || ev.type === "response.incomplete") r2 = ev.response;
    }
    const order = ["response.created", "response.in_progress", "response.output_item.added",
                   "response.content_part.added"];
    check(JSON.stringify(types.slice(0, 4)) === JSON.stringify(order), `the stream opens in order: ${types.slice(0, 4)}`);
    check(types.includes("response.output_text.delta"), "the stream carries text deltas");
    check(JSON.stringify(types.slice(-4, -1)) === JSON.stringify(["response.output_text.done",
          "response.content_part.done", "response.output_item.done"]), `the stream closes in order: ${types.slice(-4)}`);
    check(r2 && r2.output[0].content[0].text === text && text.length > 0,
          `turn 2 streamed: ${JSON.stringify(text)}`);
    const c2 = r2.usage.input_tokens_details.cached_tokens;
    check(c2 > 0 && r2.kvpd.prefilled_tokens < 8, `turn 2: ${c2} tokens cached, ${r2.kvpd.prefilled_tokens} prefilled`);
    check(r2.previous_response_id === r1.id, "turn 2 names turn 1");

    const r3 = await client.responses.create({ model, input: " The end", previous_response_id: r2.id, max_output_tokens: 8 });
    const c3 = r3.usage.input_tokens_details.cached_tokens;
    check(c3 > c2, `turn 3: cached_tokens grew (${c2} -> ${c3})`);
    check(r3.kvpd.session === r2.kvpd.session && r2.kvpd.session === r1.kvpd.session,
          "the chain is one kvpd session");

    // The SDK's stream helper builds the final response from the events.
    const helper = client.responses.stream({ model, input: "Tom had a dog", max_output_tokens: 64, stop: "." });
    const final = await helper.finalResponse();
    check(final.status === "completed" && final.output_text.length > 0,
          `responses.stream().finalResponse(): ${JSON.stringify(final.output_text)}`);

    const got = await client.responses.retrieve(r2.id);
    check(got.id === r2.id && got.output_text === r2.output_text, "retrieve gives the stored response");
    await client.responses.delete(r2.id);
    try {
      await client.responses.retrieve(r2.id);
      throw new Error("FAIL: a deleted response was retrieved");
    } catch (e) {
      check(e instanceof OpenAI.NotFoundError, `a deleted response is gone: ${e.message}`);
    }
    try {
      await client.responses.create({ model, input: "x", text: { format: { type: "json_object" } } });
      throw new Error("FAIL: text.format was accepted");
    } catch (e) {
      check(e instanceof OpenAI.BadRequestError && e.param === "text.format", `text.format refused: ${e.message}`);
    }

    // Text completions, whole and streamed; the second prompt extends the first.
    const p1 = "Once upon a time";
    const t1 = await client.completions.create({ model: "gpt-3.5-turbo-instruct", prompt: p1, max_tokens: 10 });
    check(t1.object === "text_completion" && t1.choices[0].text.length > 0, `completion: ${JSON.stringify(t1.choices[0].text)}`);
    const s = await client.completions.create({
      model: "gpt-3.5-turbo-instruct", prompt: p1 + t1.choices[0].text + " and", max_tokens: 6,
      stream: true, stream_options: { include_usage: true },
    });
    let streamed = "", usage = null;
    for await (const ch of s) {
      if (ch.choices.length) streamed += ch.choices[0].text;
      if (ch.usage) usage = ch.usage;
    }
    check(streamed.length > 0, `streamed completion: ${JSON.stringify(streamed)}`);
    check(usage && usage.prompt_tokens_details.cached_tokens >= t1.usage.total_tokens - 1,
          `the extending prompt reused ${usage && usage.prompt_tokens_details.cached_tokens} cached tokens`);
    try {
      await client.completions.create({ model, prompt: "x", echo: true });
      throw new Error("FAIL: echo was accepted");
    } catch (e) {
      check(e instanceof OpenAI.BadRequestError && e.param === "echo", `echo refused: ${e.message}`);
    }
  } finally {
    k.proc.kill("SIGTERM");
    const code = await exited;
    check(code === 0, `kvpd exited 0 on SIGTERM (${code})`);
  }
}

main().then(() => console.log("responses: all passed"), (e) => {
  console.error(`responses: ${e.stack || e}`);
  process.exit(1);
});
