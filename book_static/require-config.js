// Where requirejs finds the widget modules of the static book: next to this file, never a CDN.
// The files under vendor/ are copied in by `make book` (npm registry, installed anywidget wheel).
(function () {
  var here = document.currentScript.src.replace(/[^/]*$/, "");
  window.require.config({
    paths: {
      anywidget: here + "vendor/anywidget/index",
      "@jupyter-widgets/html-manager/dist": here + "vendor/html-manager",
    },
  });
})();
