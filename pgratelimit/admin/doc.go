// Package admin reads what an operator looks at and the limiters do not
// need for a check: the stored rows of a prefix's keys (Keys) and how many
// of them are near or at their limit (CountKeys). It reads the library's
// tables through the statements of the library and changes nothing; the
// operator UI (package ui) and the CLI use it. Changes go through a
// Limiter or a Semaphore, with the app's policy.
package admin
