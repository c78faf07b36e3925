// Typesets the maths of the built HTML book once, at build time, so that a page arrives with its
// formulas drawn and loads no MathJax: every `\(...\)` in Sphinx's `span.math` and every `\[...\]`
// in its `div.math` becomes MathJax's CHTML markup (the output a reader's browser used to make),
// with its MathML beside it for screen readers (MathJax's assistive MathML). Each page gets the
// CHTML stylesheet of the characters it uses, in its <head>; the fonts are the woff files of
// mathjax-full, copied into _static/mathjax-woff of the book.
//
//     node book_ext/typeset_maths.mjs _build/html [page.html ...]
//
// With only the folder, every .html file under it; pages are read, typeset and written back
// (atomically), and a page with no formula left as TeX is not written at all, so running it again
// changes nothing. A TeX error fails the run, naming the page and the formula; so does a
// `span.math`/`div.math` whose content is not a formula between the delimiters above.
//
// The formulas' size follows the text around them in CSS (book.css: 1ex of the text is 1ex of the
// maths), as MathJax's matchFontHeight did in the browser; hence the em and ex given here, whose
// ratio is the TeX fonts' x-height, so that no formula carries a scale of its own.

import { createHash } from "node:crypto";
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const require = createRequire(import.meta.url);
const { mathjax } = require("mathjax-full/js/mathjax.js");
const { TeX } = require("mathjax-full/js/input/tex.js");
const { CHTML } = require("mathjax-full/js/output/chtml.js");
const { liteAdaptor } = require("mathjax-full/js/adaptors/liteAdaptor.js");
const { RegisterHTMLHandler } = require("mathjax-full/js/handlers/html.js");
const { AssistiveMmlHandler } = require("mathjax-full/js/a11y/assistive-mml.js");
const { AllPackages } = require("mathjax-full/js/input/tex/AllPackages.js");

// The browser's MathJax (tex-chtml.js) had base, ams, newcommand and configmacros, and loaded the
// other packages when a formula used one of their macros (autoload); all of them are here from
// the start. Left out: noerrors and noundefined (an error must stop the build, not be drawn in
// red), and textmacros and tagformat, which the browser did not load.
const LEFT_OUT = new Set(["noerrors", "noundefined", "textmacros", "tagformat"]);
export const PACKAGES = AllPackages.filter((p) => !LEFT_OUT.has(p));

const EM = 16;
const X_HEIGHT = 0.442; // the x-height of MathJax's TeX fonts, in em
export const FONT_DIR = "_static/mathjax-woff";
const WOFF = path.join(
  path.dirname(require.resolve("mathjax-full/package.json")),
  "es5/output/chtml/fonts/woff-v2",
);
const STYLE_ID = "gptlib-maths-chtml";

const adaptor = liteAdaptor();
AssistiveMmlHandler(RegisterHTMLHandler(adaptor));

// Sphinx's markup of a formula (sphinx.ext.mathjax's visitors, which book_ext/built_maths.py
// reuses): the TeX is HTML-escaped between the delimiters.
const INLINE = /(<span class="math notranslate nohighlight"[^>]*>)\\\(([\s\S]*?)\\\)<\/span>/g;
const DISPLAY =
  /(<div class="math notranslate nohighlight"[^>]*>\s*)((?:<span class="eqno">[\s\S]*?<\/span>)?)\\\[([\s\S]*?)\\\]<\/div>/g;
// any element of Sphinx's maths, typeset or not, and the start of its content
const ANY_MATH = /<(span|div) class="math notranslate nohighlight"[^>]*>([\s\S]{0,400})/g;

const NAMED = { amp: "&", lt: "<", gt: ">", quot: '"', apos: "'", nbsp: "\u00a0" };

export class MathsError extends Error {}

/** The text of HTML-escaped TeX. */
export function unescapeHtml(text) {
  return text.replace(/&(#x[0-9a-fA-F]+|#[0-9]+|[a-zA-Z]+);/g, (whole, name) => {
    if (name[0] === "#") {
      const hex = name[1] === "x" || name[1] === "X";
      return String.fromCodePoint(Number.parseInt(name.slice(hex ? 2 : 1), hex ? 16 : 10));
    }
    if (!(name in NAMED)) throw new MathsError(`unknown HTML entity ${whole}`);
    return NAMED[name];
  });
}

/** One page's typesetter: a TeX input and CHTML output of their own, as a page had in the
 * browser (a \newcommand holds for the rest of its page only). */
function pageDocument(fontURL) {
  const tex = new TeX({
    packages: PACKAGES,
    formatError: (_jax, err) => {
      throw err;
    },
  });
  const chtml = new CHTML({ fontURL, adaptiveCSS: true });
  const doc = mathjax.document("", { InputJax: tex, OutputJax: chtml });
  return { doc, chtml };
}

/**
 * The page's HTML with its formulas typeset, or null when it has none left as TeX.
 * `name` names the page in errors; `fontURL` is the fonts' folder relative to the page.
 */
export function typesetPage(html, name, fontURL) {
  if (html.search(INLINE) < 0 && html.search(DISPLAY) < 0) {
    checkAllTypeset(html, name);
    return null;
  }
  const { doc, chtml } = pageDocument(fontURL);
  const render = (escaped, display) => {
    let tex;
    try {
      tex = unescapeHtml(escaped);
      const node = doc.convert(tex, {
        display,
        em: EM,
        ex: EM * X_HEIGHT,
        containerWidth: 80 * EM,
      });
      return adaptor.outerHTML(node);
    } catch (err) {
      const what = display ? "\\[...\\]" : "\\(...\\)";
      throw new MathsError(
        `${name}: TeX error in ${what} ${JSON.stringify(tex ?? escaped)}: ${err.message}`,
      );
    }
  };
  let out = html.replace(INLINE, (_m, open, tex) => `${open}${render(tex, false)}</span>`);
  out = out.replace(DISPLAY, (_m, open, eqno, tex) => `${open}${eqno}${render(tex, true)}</div>`);
  checkAllTypeset(out, name);
  const css = adaptor.textContent(chtml.styleSheet(doc));
  const style = `<style id="${STYLE_ID}">\n${css}\n</style>\n`;
  const head = out.indexOf("</head>");
  if (head < 0) throw new MathsError(`${name}: no </head> to put the maths' stylesheet in`);
  if (out.includes(`<style id="${STYLE_ID}">`)) {
    throw new MathsError(`${name}: formulas left as TeX beside typeset ones`);
  }
  return out.slice(0, head) + style + out.slice(head);
}

/** Fails when an element of Sphinx's maths holds anything but MathJax's markup. */
function checkAllTypeset(html, name) {
  for (const m of html.matchAll(ANY_MATH)) {
    const content = m[2].trimStart().replace(/^<span class="eqno">[\s\S]*?<\/a><\/span>/, "");
    if (!content.startsWith("<mjx-container")) {
      const start = JSON.stringify(content.slice(0, 80));
      throw new MathsError(
        `${name}: a ${m[1]}.math holds no formula typeset or to typeset: ${start}`,
      );
    }
  }
}

function htmlFiles(dir) {
  const found = [];
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, entry.name);
    if (entry.isDirectory()) found.push(...htmlFiles(p));
    else if (entry.isFile() && entry.name.endsWith(".html")) found.push(p);
  }
  return found.sort();
}

function writeAtomically(file, data) {
  const tmp = `${file}.${process.pid}.tmp`;
  fs.writeFileSync(tmp, data);
  fs.renameSync(tmp, file);
}

/** Copies the woff fonts into the book (those already there with the same bytes are kept). */
export function copyFonts(root) {
  const dest = path.join(root, FONT_DIR);
  fs.mkdirSync(dest, { recursive: true });
  const sha = (f) => createHash("sha256").update(fs.readFileSync(f)).digest("hex");
  for (const name of fs.readdirSync(WOFF)) {
    const from = path.join(WOFF, name);
    const to = path.join(dest, name);
    if (!fs.existsSync(to) || sha(to) !== sha(from)) writeAtomically(to, fs.readFileSync(from));
  }
}

/** Typesets the pages (all .html under root when none is named); returns how many changed. */
export function typesetBook(root, pages = []) {
  copyFonts(root);
  const files = pages.length ? pages.map((p) => path.resolve(root, p)) : htmlFiles(root);
  let changed = 0;
  for (const file of files) {
    const name = path.relative(root, file);
    const fontURL = path.relative(path.dirname(file), path.join(root, FONT_DIR)) || ".";
    const out = typesetPage(fs.readFileSync(file, "utf8"), name, fontURL.split(path.sep).join("/"));
    if (out !== null) {
      writeAtomically(file, out);
      changed += 1;
    }
  }
  return changed;
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const [root, ...pages] = process.argv.slice(2);
  if (!root) {
    console.error("usage: node book_ext/typeset_maths.mjs HTML_FOLDER [PAGE.html ...]");
    process.exit(2);
  }
  try {
    const start = process.hrtime.bigint();
    const changed = typesetBook(root, pages);
    const ms = Number(process.hrtime.bigint() - start) / 1e6;
    console.log(`typeset the maths of ${changed} page(s) in ${(ms / 1000).toFixed(1)} s`);
  } catch (err) {
    console.error(err instanceof MathsError ? err.message : err.stack);
    process.exit(1);
  }
}
