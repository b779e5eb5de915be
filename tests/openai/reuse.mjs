// Prefix reuse through the official `openai` SDK (pinned in package.json) on stories260K:
// the client patterns that continue a conversation from an earlier point — regenerating
// the last reply, editing the last user message, sending a reply back with its leading
// space trimmed — cut the session back in place; branching a named session from its
// first turn forks a new session from its cache (the source keeps going), and a new
// conversation with another's system prompt forks that one's; each prefills only what
// follows the common prefix. Checks, per
// request: cached_tokens is at least the part of the prompt shared with the earlier
// transcript minus one chunk, and the daemon's prefilled_tokens is prompt minus cached.
// Two API keys are two tenants: nothing of one is reused under the other. Exits non-zero
// on any failure.
//
//   KVP_BUILD=build node tests/openai/reuse.mjs      (meson test --suite openai runs it)
import { join } from "node:path";
import { checker, importOpenAI, shared, spawnKvpd, stopKvpd as stop } from "./lib.mjs";

const KEY_A = "tenant-a-key", KEY_B = "tenant-b-key";
const CHUNK = 16;
const check = checker("reuse");
const OpenAI = await importOpenAI("reuse");

// kvpd on stories260K with two API keys (two tenants); greedy, short replies.
const startKvpd = (extra) => spawnKvpd([
  "--listen", "127.0.0.1:0", "--model", join(shared, "models", "stories260K.bin"),
  "--tokenizer", join(shared, "models", "tok512.bin"),
  "--workers", "2", "--budget", "64", "--chunk", String(CHUNK),
  "--temperature", "0", "--max-tokens", "24", "--api-key", `${KEY_A},${KEY_B}`,
  // no state dir: the default one is shared by the suite's daemons, one at a time
  "--state-dir", "", ...extra,
]);

async function stopKvpd(k) {
  const code = await stop(k);
  check(code === 0, `kvpd exited 0 on SIGTERM (${code})`);
}

// r reused at least `shared` tokens (less one chunk) and prefilled exactly the rest.
function reused(r, sharedTokens, what) {
  const u = r.usage, cached = u.prompt_tokens_details.cached_tokens;
  check(cached >= sharedTokens - CHUNK && cached < u.prompt_tokens,
        `${what}: cached ${cached} of ${u.prompt_tokens} (shared at least ${sharedTokens}, less a chunk)`);
  check(r.kvpd.prefilled_tokens === u.prompt_tokens - cached,
        `${what}: prefilled ${r.kvpd.prefilled_tokens} = prompt ${u.prompt_tokens} - cached ${cached}`);
}

async function metric(port, name) {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  const m = text.match(new RegExp(`^${name.replace(/[{}"]/g, "\\$&")} (\\d+)`, "m"));
  return m ? Number(m[1]) : NaN;
}

async function main() {
  const k = await startKvpd([]);
  try {
    const a = new OpenAI({ baseURL: `http://127.0.0.1:${k.port}/v1`, apiKey: KEY_A, maxRetries: 0 });
    const b = new OpenAI({ baseURL: `http://127.0.0.1:${k.port}/v1`, apiKey: KEY_B, maxRetries: 0 });
    const model = (await a.models.list()).data[0].id;
    const ask = (client, messages, extra = {}) =>
      client.chat.completions.create({ model, messages, max_tokens: 12, ...extra });

    // Two turns of one conversation.
    const m1 = [{ role: "user", content: "Once upon a time there was a little girl named Lily" }];
    const r1 = await ask(a, m1);
    const a1 = r1.choices[0].message.content;
    const sid = r1.session;
    const turn1 = r1.usage.prompt_tokens + r1.usage.completion_tokens;
    const m2 = [...m1, { role: "assistant", content: a1 }, { role: "user", content: "She went to the park" }];
    const r2 = await ask(a, m2);
    // A request that continues a conversation found by its transcript is not handed the
    // session's id (only the request that made or named it is): null there, where a new
    // session (a fork too) would name its own.
    check(sid && r2.session === null, "turn 2 continues turn 1's session");
    const a2 = r2.choices[0].message.content;

    // Regenerate: the same request again. Its whole prompt is in the cache (the last
    // prompt token is run again for its logits).
    const rewindsBefore = await metric(k.port, "kvpd_prefix_rewinds_total");
    const rg = await ask(a, m2);
    check(rg.session === null, "regenerate: the same session, cut back in place");
    reused(rg, r2.usage.prompt_tokens - 1, "regenerate");
    check(rg.usage.prompt_tokens_details.cached_tokens === r2.usage.prompt_tokens - 1,
          "regenerate: every prompt token but the last came from the cache");
    check(rg.choices[0].message.content === a2, "regenerate: at temperature 0 the same reply again");
    check(await metric(k.port, "kvpd_prefix_rewinds_total") === rewindsBefore + 1,
          "regenerate: counted in kvpd_prefix_rewinds_total");

    // Edit the last user message: turn 1 is shared.
    const me = [...m1, { role: "assistant", content: a1 }, { role: "user", content: "She ate a red apple" }];
    const re = await ask(a, me);
    check(re.session === null, "edit-last: the same session");
    reused(re, turn1, "edit-last");
    const ae = re.choices[0].message.content;

    // The reply sent back with its leading space trimmed, then a new message: shared up
    // to where the reply's first token differs.
    // (the reply trimmed of the whitespace around it, or of its first character when it
    // has none: either way it differs from the tokens the session generated)
    const sent = ae.trim() !== ae ? ae.trim() : ae.slice(1);
    check(sent !== ae, `trimmed-reply: ${JSON.stringify(ae)} sent back as ${JSON.stringify(sent)}`);
    const mt = [...me, { role: "assistant", content: sent }, { role: "user", content: "The end" }];
    const rt = await ask(a, mt);
    check(rt.session === null, "trimmed-reply: the same session");
    reused(rt, re.usage.prompt_tokens, "trimmed-reply");

    // Then it goes on as usual: the next turn extends it exactly.
    const at = rt.choices[0].message.content;
    const mn = [...mt, { role: "assistant", content: at }, { role: "user", content: "Lily smiled" }];
    const rn = await ask(a, mn);
    check(rn.session === null && rn.usage.prompt_tokens_details.cached_tokens >=
          rt.usage.prompt_tokens + rt.usage.completion_tokens - 1,
          "after the cut the conversation goes on from its new transcript");

    // Branch a named session from its first turn: further back than its last turn, so a
    // new session forks the source's cache and the source keeps its own transcript.
    const otherBefore = await metric(k.port, 'kvpd_reused_tokens_total{source="other"}');
    const hitsBefore = await metric(k.port, "kvpd_prefix_hits_total");
    const mb = [...m1, { role: "assistant", content: a1 }, { role: "user", content: "A big dog came" }];
    const rb = await ask(a, mb, { session: sid });
    check(/^[0-9a-f]{32}$/.test(rb.session) && rb.session !== sid,
          "branch-from-turn-1: a new session forked from the named one");
    reused(rb, turn1, "branch-from-turn-1");
    check(await metric(k.port, 'kvpd_reused_tokens_total{source="other"}') ===
          otherBefore + rb.usage.prompt_tokens_details.cached_tokens,
          "branch-from-turn-1: its cached tokens count as reused from another session");
    check(await metric(k.port, "kvpd_prefix_hits_total") === hitsBefore + 1,
          "branch-from-turn-1: counted in kvpd_prefix_hits_total");
    check(await metric(k.port, "kvpd_prefix_bytes_copied_total") +
          await metric(k.port, "kvpd_cache_bytes_shared") > 0,
          "branch-from-turn-1: the fork's rows are counted, copied or shared with its source");

    // The source goes on from its own transcript, untouched by the fork...
    const an = rn.choices[0].message.content;
    const ms = [...mn, { role: "assistant", content: an }, { role: "user", content: "They played all day" }];
    const rs = await ask(a, ms);
    check(rs.session === null && rs.usage.prompt_tokens_details.cached_tokens >=
          rn.usage.prompt_tokens + rn.usage.completion_tokens - 1,
          "after the fork the source continues its own transcript from its cache");
    // ... and so does the fork, from its own.
    const ab = rb.choices[0].message.content;
    const mf = [...mb, { role: "assistant", content: ab }, { role: "user", content: "The dog was happy" }];
    const rf = await ask(a, mf);
    check(rf.session === null && rf.usage.prompt_tokens_details.cached_tokens >=
          rb.usage.prompt_tokens + rb.usage.completion_tokens - 1,
          "the fork continues its own transcript from its cache");

    // An edit of the first message of a two-turn conversation forks too (the source
    // keeps its turns): the common prefix is the template's start and the shared text.
    const mx = [{ role: "user", content: "Once upon a time there was a little boy named Tom" }];
    const rx = await ask(a, mx);
    check(/^[0-9a-f]{32}$/.test(rx.session) && rx.session !== sid && rx.session !== rb.session,
          "edit-first: a new session");
    check(rx.kvpd.prefilled_tokens === rx.usage.prompt_tokens - rx.usage.prompt_tokens_details.cached_tokens,
          "edit-first: prefilled is prompt minus cached");

    // A new conversation whose first message starts as another's did: found by the
    // prefix index at token level (no message is shared), forked from that one's cache.
    const opening = "Once upon a time, in a small village near a big green forest, there lived a little";
    const rq1 = await ask(a, [{ role: "user", content: `${opening} girl named Lily who loved flowers` }]);
    const hitsQ = await metric(k.port, "kvpd_prefix_hits_total");
    const rq2 = await ask(a, [{ role: "user", content: `${opening} boy named Tom who loved trucks` }]);
    check(/^[0-9a-f]{32}$/.test(rq2.session) && rq2.session !== rq1.session,
          "same opening: a new conversation");
    check(rq2.usage.prompt_tokens_details.cached_tokens >= CHUNK &&
          rq2.usage.prompt_tokens_details.cached_tokens < rq2.usage.prompt_tokens,
          `same opening: ${rq2.usage.prompt_tokens_details.cached_tokens} of ${rq2.usage.prompt_tokens} prompt tokens from the first's cache`);
    check(rq2.kvpd.prefilled_tokens === rq2.usage.prompt_tokens - rq2.usage.prompt_tokens_details.cached_tokens,
          "same opening: prefilled is prompt minus cached");
    check(await metric(k.port, "kvpd_prefix_hits_total") === hitsQ + 1, "same opening: an index hit");
    check(await metric(k.port, "kvpd_prefix_index_bytes") > 0, "the prefix index reports its memory");
    // the source is unchanged: its regenerate still finds its whole prompt cached
    const rq1b = await ask(a, [{ role: "user", content: `${opening} girl named Lily who loved flowers` }]);
    check(rq1b.session === null &&
          rq1b.usage.prompt_tokens_details.cached_tokens === rq1.usage.prompt_tokens - 1,
          "same opening: the source's own regenerate still reuses its whole prompt");

    // Fifteen conversations that open with the same long text, started at once after a
    // first one: each forks the first's cache (a source may serve many forks) and
    // prefills only its own ending, not the opening again.
    const story = "Once upon a time there was a little cat named Tim. Tim lived in a big house with a " +
      "kind old woman. Every morning Tim sat by the window and looked at the birds in the tree. " +
      "One day a small bird flew down to the garden and sang a happy song. Tim wanted to play " +
      "with the bird, so he went outside and sat very still in the green grass.";
    const r0 = await ask(a, [{ role: "user", content: story }]);
    const P0 = r0.usage.prompt_tokens;
    const endings = Array.from({ length: 15 }, (_, i) => ` Then friend number ${i + 1} came to play.`);
    const rs15 = await Promise.all(endings.map((e) => ask(a, [{ role: "user", content: story + e }])));
    let prefilled = 0, own = 0;
    for (const r of rs15) {
      check(/^[0-9a-f]{32}$/.test(r.session) && r.session !== r0.session && r.usage.prompt_tokens_details.cached_tokens >= P0 - CHUNK,
            `shared opening x15: cached ${r.usage.prompt_tokens_details.cached_tokens} of ${r.usage.prompt_tokens} (the opening is ${P0})`);
      check(r.kvpd.prefilled_tokens === r.usage.prompt_tokens - r.usage.prompt_tokens_details.cached_tokens,
            "shared opening x15: prefilled is prompt minus cached");
      prefilled += r.kvpd.prefilled_tokens;
      own += r.usage.prompt_tokens - P0;
    }
    check(new Set(rs15.map((r) => r.session)).size === 15, "shared opening x15: fifteen sessions");
    check(prefilled <= own + 15 * CHUNK,
          `shared opening x15: ${prefilled} tokens prefilled in all, at most their own ${own} + a chunk each`);

    // Conversations that share a system prompt (stories260K's template does not render
    // it, so what they share is the rendering of "Tell me about the"): the second forks
    // the first's cache and prefills only the tokens after the common prefix.
    const sys = { role: "system", content: "You are a storyteller who tells short happy stories about animals in the forest, with a dog, a cat, a bird and a fox who are all friends and play together every day." };
    const rp1 = await ask(a, [sys, { role: "user", content: "Tell me about the dog" }]);
    const rp2 = await ask(a, [sys, { role: "user", content: "Tell me about the cat" }]);
    check(/^[0-9a-f]{32}$/.test(rp2.session) && rp2.session !== rp1.session,
          "shared system prompt: two conversations");
    const sharedBefore = await metric(k.port, 'kvpd_reused_tokens_total{source="shared"}');
    // the two prompts differ only in their last word: at most its 3 tokens and the end
    reused(rp2, rp1.usage.prompt_tokens - 4, "shared system prompt");
    check(rp2.usage.prompt_tokens_details.cached_tokens >= rp1.usage.prompt_tokens - 4,
          "shared system prompt: all but the last word's tokens came from the first's cache");
    const rp3 = await ask(a, [sys, { role: "user", content: "Tell me about the bird" }]);
    check(await metric(k.port, 'kvpd_reused_tokens_total{source="shared"}') ===
          sharedBefore + rp3.usage.prompt_tokens_details.cached_tokens &&
          rp3.usage.prompt_tokens_details.cached_tokens > 0,
          "shared system prompt: counted as reused from a shared prefix");

    // Another tenant: the same prompt reuses nothing of tenant A's.
    const rB = await ask(b, mb);
    check(/^[0-9a-f]{32}$/.test(rB.session) && rB.session !== sid && rB.usage.prompt_tokens_details.cached_tokens === 0 &&
          rB.kvpd.prefilled_tokens === rB.usage.prompt_tokens,
          "key B: the same prompt as key A's gets cached_tokens 0, prefilled whole");
    const rB2 = await ask(b, mb);
    check(rB2.session === null && rB2.usage.prompt_tokens_details.cached_tokens > 0,
          "key B: its own regenerate reuses its own session");

    // Counters: reuse from the session's own cache.
    check(await metric(k.port, 'kvpd_reused_tokens_total{source="own"}') > 0,
          "kvpd_reused_tokens_total{source=\"own\"} counts the reused tokens");
  } finally {
    await stopKvpd(k);
  }
}

main().then(() => console.log("reuse: all passed"), (e) => {
  console.error(`reuse: ${e.stack || e}`);
  process.exit(1);
});
