package demomodel

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// tokenizerJSON returns a plausible Hugging Face tokenizer.json for a BPE
// vocabulary of vocab tokens: Llama's special and byte-fallback tokens, then
// deterministic made-up subwords, and merges for them.
func tokenizerJSON(vocab int, seed int64) []byte {
	r := rng{s: mix(uint64(seed) ^ 0x746f6b656e)}
	tokens := []string{"<unk>", "<s>", "</s>"}
	for b := 0; b < 256; b++ {
		tokens = append(tokens, fmt.Sprintf("<0x%02X>", b))
	}
	// A valid BPE: after the byte-fallback tokens come single characters,
	// then each further token is the concatenation of two earlier ones,
	// recorded as a merge, as BPE training produces them.
	seen := make(map[string]bool, vocab)
	for _, t := range tokens {
		seen[t] = true
	}
	first := len(tokens)
	for _, c := range "▁etaoinshrdlcumwfgypbvkjxqzETAOINSHRDLCUMWFGYPBVKJXQZ0123456789.,'-" {
		if len(tokens) < vocab {
			tokens = append(tokens, string(c))
			seen[string(c)] = true
		}
	}
	letters := len(tokens)
	var merges []string
	for tries := 0; len(tokens) < vocab && tries < 100*vocab; tries++ {
		// Left: a recent token (words grow), right: mostly a short one.
		a := tokens[first+int(r.next()%uint64(len(tokens)-first))]
		if r.next()%4 != 0 {
			a = tokens[max(first, len(tokens)-200)+int(r.next()%uint64(min(200, len(tokens)-first)))]
		}
		b := tokens[first+int(r.next()%uint64(letters-first))]
		if r.next()%3 == 0 {
			b = tokens[first+int(r.next()%uint64(len(tokens)-first))]
		}
		w := a + b
		if seen[w] || len(w) > 16 || (b == "▁") {
			continue
		}
		seen[w] = true
		tokens = append(tokens, w)
		merges = append(merges, a+" "+b)
	}
	for i := 0; len(tokens) < vocab; i++ { // only if the loop above gave up
		w := fmt.Sprintf("<extra_%d>", i)
		if !seen[w] {
			seen[w] = true
			tokens = append(tokens, w)
		}
	}
	var b bytes.Buffer
	str := func(s string) {
		q, _ := json.Marshal(s)
		b.Write(q)
	}
	b.WriteString(`{
  "version": "1.0",
  "truncation": null,
  "padding": null,
  "added_tokens": [`)
	for i, t := range tokens[:3] {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "\n    {\"id\": %d, \"content\": ", i)
		str(t)
		b.WriteString(`, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}`)
	}
	b.WriteString(`
  ],
  "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
  "pre_tokenizer": null,
  "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
  "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
  "model": {
    "type": "BPE",
    "dropout": null,
    "unk_token": "<unk>",
    "continuing_subword_prefix": null,
    "end_of_word_suffix": null,
    "fuse_unk": true,
    "byte_fallback": true,
    "vocab": {`)
	for i, t := range tokens {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("\n      ")
		str(t)
		fmt.Fprintf(&b, ": %d", i)
	}
	b.WriteString("\n    },\n    \"merges\": [")
	for i, m := range merges {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("\n      ")
		str(m)
	}
	b.WriteString("\n    ]\n  }\n}\n")
	return b.Bytes()
}
