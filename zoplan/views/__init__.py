"""What zoplan prints and exports: rich tables, panels and Gantt charts, Chrome trace
events and SVG. Views take plans, traces and results; they never compute them."""
