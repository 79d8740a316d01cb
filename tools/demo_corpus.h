/* demo_corpus.h - the text the demo model's BPE merges are learned from:
 * English prose, code and a little non-ASCII, so the demo tokenizer splits
 * ordinary text into sensible pieces. Changing it changes the demo model. */
#ifndef VLMD_DEMO_CORPUS_H
#define VLMD_DEMO_CORPUS_H

static const char demo_corpus[] =
    "vlmd is a server for vision-language models. It answers the OpenAI API over HTTP, "
    "streams tokens as they are generated, and never runs out of GPU memory: it measures "
    "memory once at start-up, reserves everything, and turns overload into waiting, "
    "preemption or a clear refusal. The router sends images to the visual worker and text "
    "to the language model engine. The engine runs many requests at once with continuous "
    "batching, a prefix cache and chunked prefill.\n"
    "A user asks: What is in this picture? The assistant answers: The picture shows a red "
    "bicycle leaning against a wall, with a small dog sitting next to it in the sunshine.\n"
    "The quick brown fox jumps over the lazy dog. The five boxing wizards jump quickly. "
    "How vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow.\n"
    "In the morning the market opens at nine, and the first customers buy bread, cheese, "
    "coffee and fresh fruit. In the evening the streets are quiet again, and the lights of "
    "the houses come on one by one along the river.\n"
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159 1e-6 65535.\n"
    "Caf\xc3\xa9 cr\xc3\xa8me br\xc3\xbbl\xc3\xa9" "e, na\xc3\xafve r\xc3\xa9sum\xc3\xa9, "
    "Stra\xc3\x9f" "e, \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e, \xe4\xb8\xad\xe6\x96\x87, "
    "\xd0\xbf\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82, \xf0\x9f\x99\x82.\n"
    "int main(int argc, char **argv)\n{\n    for (int i = 0; i < argc; i++)\n"
    "        printf(\"%s\\n\", argv[i]);\n    return 0;\n}\n"
    "def generate(model, prompt, max_tokens=16):\n    tokens = tokenize(prompt)\n"
    "    for _ in range(max_tokens):\n        logits = model(tokens)\n"
    "        tokens.append(int(logits[-1].argmax()))\n    return detokenize(tokens)\n"
    "{\"model\": \"demo\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}], "
    "\"max_tokens\": 32, \"temperature\": 0.7, \"stream\": true}\n"
    "The system prompt says: You are a helpful assistant. Answer briefly and clearly, and "
    "say so when you do not know. The user writes: Please describe the image and count the "
    "people in it. There are three people standing near the window and one person sitting "
    "at the table, so four people in total.\n"
    "Memory is measured in bytes, kilobytes, megabytes and gigabytes; time in seconds and "
    "milliseconds; throughput in tokens per second; latency as the time to the first token "
    "and the time between tokens. A benchmark reports the ratio to the hardware ceiling.\n";

#endif
