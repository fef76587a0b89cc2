async () => {
  // Every character of the page that needs a CJK or emoji font (the CJK blocks of the book's web
  // font's unicode-range, and everything beyond the Basic Multilingual Plane), drawn on a canvas
  // in its element's computed font (style, weight, family list), compared with what that font
  // draws for code points no font has (the missing-glyph box, .notdef). Text of hidden
  // elements (folded solutions, an explorer's other settings) is checked too.
  const NEEDS = /[\u2E80-\u9FFF\uF900-\uFAFF\uFE30-\uFE4F\uFF00-\uFFEF]|[\u{10000}-\u{10FFFF}]/u;
  const NOTDEF = ['\u{10FFFD}', '\u{FFFFD}'];
  const canvas = document.createElement('canvas');
  canvas.width = 64; canvas.height = 64;
  const ctx = canvas.getContext('2d', {willReadFrequently: true});
  const draw = (font, ch) => {
    ctx.clearRect(0, 0, 64, 64); ctx.font = font; ctx.textBaseline = 'middle';
    ctx.fillStyle = '#000'; ctx.fillText(ch, 4, 32);
    const d = ctx.getImageData(0, 0, 64, 64).data;
    let h = 0, ink = 0;
    for (let i = 3; i < d.length; i += 4) { h = (h * 31 + d[i]) | 0; ink += d[i] > 0; }
    return h + ':' + ink;
  };
  const seen = new Map();
  const walker = document.createTreeWalker(document.documentElement, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!el || !NEEDS.test(n.data) || ['SCRIPT', 'STYLE', 'TITLE', 'NOSCRIPT'].includes(el.tagName)
        || el.closest('script, template, mjx-assistive-mml')) continue;
    const cs = getComputedStyle(el);
    const font = `${cs.fontStyle} ${cs.fontWeight} 40px ${cs.fontFamily}`;
    for (const ch of n.data) {
      if (!NEEDS.test(ch)) continue;
      const key = font + '\u0000' + ch;
      if (!seen.has(key)) {
        const cls = String(el.className || '').split(' ')[0];
        seen.set(key, {font, ch, where: el.tagName.toLowerCase() + (cls ? '.' + cls : '')});
      }
    }
  }
  for (const v of seen.values()) { try { await document.fonts.load(v.font, v.ch); } catch (e) {} }
  const boxes = new Map();
  const missing = [];
  for (const v of seen.values()) {
    if (!boxes.has(v.font)) boxes.set(v.font, new Set(NOTDEF.map(c => draw(v.font, c))));
    if (boxes.get(v.font).has(draw(v.font, v.ch))) missing.push(`${v.ch} in ${v.where} (${v.font})`);
  }
  return {checked: seen.size, chars: new Set([...seen.values()].map(v => v.ch)).size, missing};
}
