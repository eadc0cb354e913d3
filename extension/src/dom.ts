/** Small DOM builders: the panel is plain elements, styled by JupyterLab's CSS variables. */

export function h(
  tag: string,
  className: string,
  ...children: (Node | string | null)[]
): HTMLElement {
  const element = document.createElement(tag);
  if (className) {
    element.className = className;
  }
  for (const child of children) {
    if (child !== null) {
      element.append(child);
    }
  }
  return element;
}

export function table(head: string[], rows: (Node | string)[][], className = ''): HTMLElement {
  const header = h('tr', '', ...head.map(cell => h('th', '', cell)));
  const body = rows.map(row => h('tr', '', ...row.map(cell => h('td', '', cell))));
  return h('table', `jp-KernelfleetPanel-table ${className}`.trim(), h('thead', '', header),
    h('tbody', '', ...body));
}

export function section(title: string, ...children: (Node | string | null)[]): HTMLElement {
  return h('section', 'jp-KernelfleetPanel-section', h('h3', '', title), ...children);
}

export function note(text: string, className = ''): HTMLElement {
  return h('p', `jp-KernelfleetPanel-note ${className}`.trim(), text);
}
