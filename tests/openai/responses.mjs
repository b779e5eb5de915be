// The official `openai` SDK (pinned in package.json) against kvpd's Responses API and
// text completions, with the SDK's own model names (logprobs too): client.responses.create whole and
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
    // text.format: json_object constrains the reply to one JSON object; other types are refused.
    const jr = await client.responses.create({ model, input: "x", max_output_tokens: 48,
                                               text: { format: { type: "json_object" } } });
    // the length budget closes the object in time, so the response is always completed
    // (kvpd_shaped_by names the limit when it shaped the reply)
    let parsed;
    try { parsed = JSON.parse(jr.output_text); } catch (e) { parsed = undefined; }
    check(jr.status === "completed" && jr.incomplete_details === null && parsed !== null &&
          typeof parsed === "object" && !Array.isArray(parsed),
          `text.format json_object gives a whole JSON object (${jr.status}): ${JSON.stringify(jr.output_text)}`);
    check(jr.kvpd_shaped_by === undefined || jr.kvpd_shaped_by === "max_output_tokens",
          `kvpd_shaped_by names the limit (${jr.kvpd_shaped_by})`);
    // one the limit surely shapes: json_object at 8 tokens
    const js = await client.responses.create({ model, input: "x", max_output_tokens: 8,
                                               text: { format: { type: "json_object" } } });
    check(js.status === "completed" && typeof JSON.parse(js.output_text) === "object" &&
          (js.usage.output_tokens < 8 || js.kvpd_shaped_by === "max_output_tokens"),
          `json_object at 8 tokens: completed, whole (${js.status}, ${js.usage.output_tokens} tokens, ` +
          `${js.kvpd_shaped_by}): ${js.output_text}`);
    check(jr.text.format.type === "json_object", "the response echoes text.format");
    try {
      await client.responses.create({ model, input: "x", text: { format: { type: "xml" } } });
      throw new Error("FAIL: text.format xml was accepted");
    } catch (e) {
      check(e instanceof OpenAI.BadRequestError && e.param === "text.format", `text.format xml refused: ${e.message}`);
    }
    // A hosted tool (as Codex and the Agents SDK may declare) is left out, and the answer
    // says so in kvpd.skipped_tools; forcing one is refused.
    const hosted = await client.responses.create({ model, input: "x", max_output_tokens: 4,
                                                   tools: [{ type: "web_search" }, { type: "local_shell" }] });
    check(["completed", "incomplete"].includes(hosted.status) &&
          JSON.stringify(hosted.kvpd.skipped_tools) === JSON.stringify(["web_search", "local_shell"]),
          `hosted tools are left out and named (${hosted.status}, ${JSON.stringify(hosted.kvpd.skipped_tools)})`);
    check(hosted.output.every((it) => it.type === "message"), "the reply holds no call of a left-out tool");
    try {
      await client.responses.create({ model, input: "x", tools: [{ type: "web_search" }],
                                      tool_choice: { type: "web_search" } });
      throw new Error("FAIL: a hosted tool_choice was accepted");
    } catch (e) {
      check(e instanceof OpenAI.BadRequestError && e.param === "tool_choice", `a hosted tool forced is refused: ${e.message}`);
    }
    // generate: false (Codex's warm-up, input empty or not): completed at once, no output,
    // nothing generated or kept; streamed, the lifecycle events alone.
    const warm = await client.responses.create({ model, input: [], instructions: "Be brief.", generate: false,
                                                 store: true, max_output_tokens: 8 });
    check(warm.status === "completed" && warm.output.length === 0 && warm.usage.output_tokens === 0 &&
          warm.store === false, `generate false: an empty completed response (${JSON.stringify(warm)})`);
    try {
      await client.responses.retrieve(warm.id);
      throw new Error("FAIL: a warm-up was stored");
    } catch (e) {
      check(e instanceof OpenAI.NotFoundError, "a warm-up keeps nothing");
    }
    const warmTypes = [];
    for await (const ev of await client.responses.create({ model, input: "Hi", generate: false, stream: true }))
      warmTypes.push(`${ev.type}:${ev.sequence_number}`);
    check(warmTypes.join(" ") === "response.created:0 response.in_progress:1 response.completed:2",
          `generate false, streamed: the lifecycle alone (${warmTypes.join(" ")})`);
    for (const [extra, param] of [[{ generate: "no" }, "generate"],
                                  [{ generate: false, input: [{ type: "item_reference", id: "x" }] }, "input[0].type"]]) {
      try {
        await client.responses.create({ model, input: "x", ...extra });
        throw new Error(`FAIL: ${JSON.stringify(extra)} was accepted`);
      } catch (e) {
        check(e instanceof OpenAI.BadRequestError && e.param === param, `${JSON.stringify(extra)}: 400 naming ${param} (${e.param})`);
      }
    }
    try {
      await client.responses.create({ model, input: "x", frobnicate: 1 });
      throw new Error("FAIL: an unknown field was accepted");
    } catch (e) {
      check(e instanceof OpenAI.BadRequestError && e.param === "frobnicate" && e.code === "unknown_parameter",
            `an unknown field is a 400 naming it: ${e.message}`);
    }

    // logprobs: include message.output_text.logprobs with top_logprobs gives the chat
    // completion's values for the same conversation, whole and streamed.
    const lpPrompt = "Tom and Sue went";
    const chatLp = await client.chat.completions.create({ model, messages: [{ role: "user", content: lpPrompt }],
                                                          max_tokens: 8, logprobs: true, top_logprobs: 3 });
    const wantLp = chatLp.choices[0].logprobs.content;
    const rl = await client.responses.create({ model, input: lpPrompt, max_output_tokens: 8, top_logprobs: 3,
                                               include: ["message.output_text.logprobs"] });
    const gotLp = rl.output[0].content[0].logprobs;
    check(rl.output_text === chatLp.choices[0].message.content, `the same reply as chat completions (${JSON.stringify(rl.output_text)})`);
    check(gotLp.length === wantLp.length && gotLp.length > 0 &&
          gotLp.every((e, i) => e.token === wantLp[i].token && Math.abs(e.logprob - wantLp[i].logprob) < 1e-6 &&
                    e.top_logprobs.length === 3 && e.top_logprobs[0].token === wantLp[i].top_logprobs[0].token),
          `the response's logprobs are the chat completion's (${gotLp.length} tokens, first ${JSON.stringify(gotLp[0])})`);
    check(gotLp.map((e) => e.token).join("") === rl.output_text, "the tokens spell the reply");
    const ls = await client.responses.create({ model, input: lpPrompt, max_output_tokens: 8, top_logprobs: 3, stream: true,
                                               include: ["message.output_text.logprobs"] });
    let streamedLp = [], doneLp = null, finalLp = null;
    for await (const ev of ls) {
      if (ev.type === "response.output_text.delta") streamedLp = streamedLp.concat(ev.logprobs);
      if (ev.type === "response.output_text.done") doneLp = ev.logprobs;
      if (ev.type === "response.completed" || ev.type === "response.incomplete") finalLp = ev.response.output[0].content[0].logprobs;
    }
    check(streamedLp.length === wantLp.length && streamedLp.every((e, i) => e.token === wantLp[i].token &&
                                                                Math.abs(e.logprob - wantLp[i].logprob) < 1e-6),
          `the streamed deltas carry each token's logprobs once (${streamedLp.length})`);
    check(doneLp.length === wantLp.length && finalLp.length === wantLp.length, "output_text.done and the final item carry them all");
    const noLp = await client.responses.create({ model, input: lpPrompt, max_output_tokens: 4 });
    check(noLp.output[0].content[0].logprobs.length === 0, "without include, no logprobs");
    for (const [extra, param] of [[{ top_logprobs: 3 }, "top_logprobs"], [{ include: ["reasoning.encrypted_content"] }, "include"],
                                  [{ include: ["message.output_text.logprobs"], top_logprobs: 21 }, "top_logprobs"]]) {
      try {
        await client.responses.create({ model, input: "x", max_output_tokens: 2, ...extra });
        throw new Error(`FAIL: ${JSON.stringify(extra)} was accepted`);
      } catch (e) {
        check(e instanceof OpenAI.BadRequestError && e.param === param, `${JSON.stringify(extra)}: 400 naming ${param}: ${e.message}`);
      }
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
