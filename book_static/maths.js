// Long inline formulas on a narrow page (a phone): a formula wider than the line it sits in gets
// the class gptlib-wide-math, which book.css turns into a box of its own that scrolls sideways
// with a cue, rather than a formula that runs past the page's edge. The formulas arrive typeset
// (book_ext/typeset_maths.mjs, when the book is built): marked once the page has loaded, and
// again when the window's width changes. Formulas that fit are left as they are (a scrolling box
// would move them off the text's baseline). Each marking ends with the event
// "gptlib-maths-marked" on the document, and the first sets the attribute data-maths-marked on
// <html>; the browser tests wait for them.
(function () {
  function mark() {
    var all = document.querySelectorAll(
      'article.bd-article mjx-container[jax="CHTML"]:not([display="true"])'
    );
    all.forEach(function (m) { m.classList.remove("gptlib-wide-math"); });
    all.forEach(function (m) {
      var line = m.parentElement && m.parentElement.closest("p, li, dd, td, th, div");
      if (line && m.getBoundingClientRect().width > line.clientWidth + 1) {
        m.classList.add("gptlib-wide-math");
      }
    });
    document.documentElement.setAttribute("data-maths-marked", "");
    document.dispatchEvent(new Event("gptlib-maths-marked"));
  }
  if (document.readyState === "complete") mark();
  else window.addEventListener("load", mark);
  var timer;
  window.addEventListener("resize", function () {
    clearTimeout(timer);
    timer = setTimeout(mark, 150);
  });
})();
