// charts.js - small time series (uPlot) over the last five minutes. A chart
// keeps its points while hidden and is drawn once it has a width (uPlot
// measures nothing itself: a chart made in a hidden view would be 0 px wide).
import uPlot from 'uplot';

export const WINDOW_S = 300;
const HEIGHT = 96;
const INTEGER_STEPS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 1e5, 2e5, 5e5, 1e6];

// The colours come from the style sheet (--chart-*), so they follow the theme.
function themeColor(name, fallback) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || fallback;
}

export class TimeSeries {
  // container: the element the chart goes in; color: the CSS custom property
  // of its line (its fill: the same name with -fill); integer: a count, whose
  // axis has no fractions.
  constructor(container, color, { integer = false } = {}) {
    this.container = container;
    this.color = color;
    this.integer = integer;
    this.times = [];
    this.values = [];
    this.plot = null;
  }

  // time in seconds (uPlot's unit); value null leaves a gap.
  push(time, value) {
    this.times.push(time);
    this.values.push(value);
    let old = 0;
    while (old < this.times.length && this.times[old] < time - WINDOW_S) old++;
    if (old) {
      this.times.splice(0, old);
      this.values.splice(0, old);
    }
    this.draw();
  }

  draw() {
    const width = this.container.clientWidth;
    if (width === 0) return; // hidden: drawn when shown
    if (!this.plot) this.plot = this.create(width);
    else if (this.plot.width !== width) this.plot.setSize({ width, height: HEIGHT });
    this.plot.setData([this.times, this.values]);
  }

  create(width) {
    const line = themeColor(this.color, '#3366cc');
    const fill = themeColor(`${this.color}-fill`, 'rgba(51,102,204,0.15)');
    const axis = themeColor('--chart-axis', '#888');
    const grid = themeColor('--chart-grid', 'rgba(128,128,128,0.2)');
    const axisStyle = { stroke: axis, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1, size: 4 }, font: '11px system-ui, sans-serif' };
    const clock = (u, ticks) => ticks.map((t) => new Date(t * 1000).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', hourCycle: 'h23' }));
    const count = (u, ticks) => ticks.map((t) => (Number.isInteger(t) ? String(t) : t.toFixed(1)));
    return new uPlot({
      width,
      height: HEIGHT,
      legend: { show: false },
      cursor: { show: false },
      scales: {
        // the window ends at the last poll, whatever the data: the chart scrolls
        x: {
          time: true,
          range: (u, min, max) => {
            const end = max ?? Date.now() / 1000;
            return [end - WINDOW_S, end];
          },
        },
        y: { range: (u, min, max) => [0, Math.max(1, max ?? 0)] },
      },
      axes: [
        { ...axisStyle, size: 22, space: 40, incrs: [60, 120, 300], values: clock },
        { ...axisStyle, size: 36, space: 20, values: count, ...(this.integer ? { incrs: INTEGER_STEPS } : {}) },
      ],
      series: [{}, { stroke: line, width: 1.5, fill, points: { show: false } }],
    }, [this.times, this.values], this.container);
  }
}
