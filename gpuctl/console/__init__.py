"""The console's own machinery below its screens: terminal input (terminal_input)."""
