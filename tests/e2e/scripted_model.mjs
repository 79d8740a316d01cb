// scripted_model.mjs - a tiny model whose greedy answer is a fixed text, for the e2e tests of
// what the frontend makes of an answer (tools, reasoning, the Responses API).
//
// The model: a fixture tokenizer with the answer's pieces added as tokens (not special), and
// one layer whose attention and MLP are zero, so the logits of the last token depend on that
// token alone: its embedding is a one-hot slot and lm_head maps each slot to the tokens it
// votes for. A chat prompt ends in "\n" (of "<|im_start|>assistant\n"), so an edge from "\n"
// starts the answer.
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync, copyFileSync } from 'node:fs';
import { FIXTURES } from './harness.mjs';

// A safetensors file of F32 tensors ({name: [shape, Float32Array]}).
function safetensors(tensors) {
  const header = {};
  let offset = 0;
  for (const [name, [shape, data]] of Object.entries(tensors)) {
    header[name] = { dtype: 'F32', shape, data_offsets: [offset, offset + data.byteLength] };
    offset += data.byteLength;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - (json.length % 8)) % 8);
  const head = Buffer.alloc(8);
  head.writeBigUInt64LE(BigInt(json.length));
  return Buffer.concat([head, Buffer.from(json), ...Object.values(tensors).map(([, d]) => Buffer.from(d.buffer))]);
}

// The id of a fixture tokenizer's vocabulary symbol ("Ċ" is "\n").
export function vocabId(family, symbol) {
  return JSON.parse(readFileSync(`${FIXTURES}/${family}/tokenizer.json`, 'utf8')).model.vocab[symbol];
}

// Edges from chains: each token of a chain votes (10) for the next.
export const chainEdges = (chains) => chains.flatMap((c) => c.slice(0, -1).map((t, k) => [t, c[k + 1], 10]));

// Writes the model into dir. tokenizer: the fixture whose tokenizer and chat template it takes
// (the body is always Qwen2's); pieces: the texts added as tokens; edges: [from, to, weight],
// token `from` (an id, {piece: i} or 'end' for the end token) votes for `to`; end: the added
// token 'end' is (<|im_end|>); config: fields that replace config.json's (eos_token_id, ...);
// vocab: the embedding's rows (room for the pieces); positions: max_position_embeddings (the
// fixture's when absent). Returns the first piece's id.
export function writeScriptedModel(dir, { tokenizer: family = 'qwen2', pieces, edges, vocab = 1040, hidden = 64,
  positions, end = '<|im_end|>', config: fields = {} }) {
  const H = hidden, V = vocab;
  const tokenizer = JSON.parse(readFileSync(`${FIXTURES}/${family}/tokenizer.json`, 'utf8'));
  const firstNew = Math.max(...tokenizer.added_tokens.map((t) => t.id),
    ...Object.values(tokenizer.model.vocab)) + 1; // (Mixtral's added tokens come first)
  pieces.forEach((content, i) => tokenizer.added_tokens.push({ id: firstNew + i, content, single_word: false,
    lstrip: false, rstrip: false, normalized: false, special: false }));
  assert.ok(firstNew + pieces.length <= V, 'room for the pieces');
  writeFileSync(`${dir}/tokenizer.json`, JSON.stringify(tokenizer));
  copyFileSync(`${FIXTURES}/${family}/tokenizer_config.json`, `${dir}/tokenizer_config.json`);
  const config = JSON.parse(readFileSync(`${FIXTURES}/qwen2/config.json`, 'utf8'));
  Object.assign(config, { hidden_size: H, intermediate_size: H, num_hidden_layers: 1, layer_types: ['full_attention'],
    num_attention_heads: 1, num_key_value_heads: 1, vocab_size: V, tie_word_embeddings: false });
  if (positions) config.max_position_embeddings = positions;
  Object.assign(config, fields);
  writeFileSync(`${dir}/config.json`, JSON.stringify(config));
  const imEnd = tokenizer.added_tokens.find((t) => t.content === end).id;
  const id = (t) => (t === 'end' ? imEnd : typeof t === 'object' ? firstNew + t.piece : t);
  const embed = new Float32Array(V * H), lmHead = new Float32Array(V * H);
  const slots = new Map();
  for (const [from, to, weight] of edges) {
    const f = id(from);
    if (!slots.has(f)) {
      slots.set(f, slots.size);
      assert.ok(slots.size <= H, 'a slot for each token that votes');
      embed[f * H + slots.get(f)] = 1; // the token lights its slot
    }
    lmHead[id(to) * H + slots.get(f)] = weight; // the slot votes for the next token
  }
  const zeros = (...shape) => [shape, new Float32Array(shape.reduce((a, b) => a * b))];
  const ones = (n) => [[n], new Float32Array(n).fill(1)];
  const p = 'model.layers.0.';
  writeFileSync(`${dir}/model.safetensors`, safetensors({
    'lm_head.weight': [[V, H], lmHead], 'model.embed_tokens.weight': [[V, H], embed],
    [`${p}input_layernorm.weight`]: ones(H), [`${p}mlp.down_proj.weight`]: zeros(H, H),
    [`${p}mlp.gate_proj.weight`]: zeros(H, H), [`${p}mlp.up_proj.weight`]: zeros(H, H),
    [`${p}post_attention_layernorm.weight`]: ones(H),
    [`${p}self_attn.k_proj.bias`]: zeros(H), [`${p}self_attn.k_proj.weight`]: zeros(H, H),
    [`${p}self_attn.o_proj.weight`]: zeros(H, H),
    [`${p}self_attn.q_proj.bias`]: zeros(H), [`${p}self_attn.q_proj.weight`]: zeros(H, H),
    [`${p}self_attn.v_proj.bias`]: zeros(H), [`${p}self_attn.v_proj.weight`]: zeros(H, H),
    'model.norm.weight': ones(H),
  }));
  return firstNew;
}
