// The token ids @huggingface/tokenizers (the page's tokenizer) gives for a list of texts:
//   node tests/tokenizer_ids.mjs TOKENIZER_JSON TEXTS_JSON  ->  [[id, ...], ...] on stdout
// tests/test_export.py compares them with gptlib's tokenizers.
import { readFileSync } from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";

const [tokenizerPath, textsPath] = process.argv.slice(2);
const tokenizer = new Tokenizer(JSON.parse(readFileSync(tokenizerPath, "utf8")), {});
const texts = JSON.parse(readFileSync(textsPath, "utf8"));
const ids = texts.map((text) => Array.from(tokenizer.encode(text, { add_special_tokens: false }).ids));
process.stdout.write(JSON.stringify(ids));
