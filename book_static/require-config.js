// Where requirejs finds the widget modules of the static book: next to this file, never a CDN.
// The files under vendor/ are copied in by `make book` (npm registry, installed anywidget wheel).
(function () {
  var here = document.currentScript.src.replace(/[^/]*$/, "");
  window.require.config({
    paths: {
      anywidget: here + "vendor/anywidget/index",
      "@jupyter-widgets/html-manager/dist": here + "vendor/html-manager",
      // The module embed-amd.js defines under this name finds its fonts (Font Awesome 5) beside
      // its own address (webpack's publicPath, from the module's uri): without this entry, under
      // the page's folder, a 404 whenever the page draws an icon after the module's stylesheet
      // arrived.
      "@jupyter-widgets/html-manager": here + "vendor/html-manager/html-manager",
    },
  });
})();
