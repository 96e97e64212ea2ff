// xterm.js writes its renderer's rules (cell sizes, colours) into <style> elements it
// creates. Under the console's Content-Security-Policy (style-src 'self', no
// 'unsafe-inline') the browser refuses such inline rules. This moves them into
// constructed style sheets (document.adoptedStyleSheets), which the CSSOM may change under
// that policy: each <style> element created stays empty, and the text written to it goes to
// a sheet of its own, dropped when the element is removed. The element handed back is an
// inert <plinth-style> (hidden by style.css): the browser checks even an empty <style>
// against the policy, and reports it.

let installed = false;

export function routeInlineStyles() {
  if (installed || typeof CSSStyleSheet !== 'function' || !('adoptedStyleSheets' in document)) {
    return;
  }
  installed = true;
  const create = Document.prototype.createElement;
  Document.prototype.createElement = function createElement(name, options) {
    if (String(name).toLowerCase() !== 'style') {
      return create.call(this, name, options);
    }
    const element = create.call(this, 'plinth-style');
    adopt(element, this);
    return element;
  };
}

function adopt(element, doc) {
  const sheet = new CSSStyleSheet();
  let text = '';
  let attached = false;
  const attach = () => {
    if (!attached) {
      doc.adoptedStyleSheets = [...doc.adoptedStyleSheets, sheet];
      attached = true;
    }
  };
  const write = (value) => {
    text = value == null ? '' : String(value);
    sheet.replaceSync(text);
    attach();
  };
  for (const property of ['textContent', 'innerText', 'innerHTML']) {
    Object.defineProperty(element, property, {
      configurable: true,
      get: () => text,
      set: write,
    });
  }
  const remove = element.remove.bind(element);
  element.remove = () => {
    if (attached) {
      doc.adoptedStyleSheets = doc.adoptedStyleSheets.filter((s) => s !== sheet);
      attached = false;
    }
    remove();
  };
  // `sheet` is read by code that inserts rules one at a time.
  Object.defineProperty(element, 'sheet', { configurable: true, get: () => { attach(); return sheet; } });
}
