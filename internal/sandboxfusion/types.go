package sandboxfusion

// The request and response bodies of SandboxFusion's HTTP API, as its
// clients (verl's reward and tools among them) send and read them. Field
// names and defaults are SandboxFusion's.

// Status is a call's outcome: Success when every command finished with
// exit code 0, Failed when one did not (non-zero exit, time limit),
// SandboxError when the service could not run the code.
type Status string

const (
	Success      Status = "Success"
	Failed       Status = "Failed"
	SandboxError Status = "SandboxError"
)

// CommandStatus is how one command (a compile or a run) ended: Finished
// (with its exit code), TimeLimitExceeded (killed at its timeout) or
// Error (the service failed to run it).
type CommandStatus string

const (
	Finished          CommandStatus = "Finished"
	CommandError      CommandStatus = "Error"
	TimeLimitExceeded CommandStatus = "TimeLimitExceeded"
)

// RunCodeRequest is POST /run_code's body. Timeouts are in seconds;
// Files maps a path (relative to the code's directory, or absolute) to its
// content in base64 (null: skipped); FetchFiles names files to return.
type RunCodeRequest struct {
	Code           string             `json:"code"`
	Language       string             `json:"language"`
	CompileTimeout *float64           `json:"compile_timeout"`
	RunTimeout     *float64           `json:"run_timeout"`
	MemoryLimitMB  *int               `json:"memory_limit_MB"`
	Stdin          *string            `json:"stdin"`
	Files          map[string]*string `json:"files"`
	FetchFiles     []string           `json:"fetch_files"`
}

// CommandResult is one command's outcome; execution_time is in seconds.
// ReturnCode is absent when the command did not finish.
type CommandResult struct {
	Status        CommandStatus `json:"status"`
	ExecutionTime *float64      `json:"execution_time"`
	ReturnCode    *int          `json:"return_code"`
	Stdout        *string       `json:"stdout"`
	Stderr        *string       `json:"stderr"`
}

// RunCodeResponse is POST /run_code's answer. CompileResult is absent for
// interpreted languages; RunResult is absent when the compile failed.
// Files holds the fetched files that exist, in base64.
type RunCodeResponse struct {
	Status          Status            `json:"status"`
	Message         string            `json:"message"`
	CompileResult   *CommandResult    `json:"compile_result"`
	RunResult       *CommandResult    `json:"run_result"`
	ExecutorPodName *string           `json:"executor_pod_name"`
	Files           map[string]string `json:"files"`
}

// RunJupyterRequest is POST /run_jupyter's body: cells run in order in
// one Python process, each seeing what the ones before it defined.
// CellTimeout 0 means no limit per cell; TotalTimeout bounds them all.
type RunJupyterRequest struct {
	Cells         []string          `json:"cells"`
	CellTimeout   *float64          `json:"cell_timeout"`
	TotalTimeout  *float64          `json:"total_timeout"`
	MemoryLimitMB *int              `json:"memory_limit_MB"`
	Kernel        string            `json:"kernel"`
	Files         map[string]string `json:"files"`
	FetchFiles    []string          `json:"fetch_files"`
}

// CellResult is one cell's output: Display holds, as Jupyter's data
// bundles ({mime type: data}, images in base64), each display() call, each
// matplotlib figure shown (with its image/png) and the value of the cell's
// last expression; Error the exception it raised ({ename, evalue,
// traceback}).
type CellResult struct {
	Stdout  string           `json:"stdout"`
	Stderr  string           `json:"stderr"`
	Display []map[string]any `json:"display"`
	Error   []map[string]any `json:"error"`
}

// RunJupyterResponse is POST /run_jupyter's answer. Driver is the process
// that ran the cells.
type RunJupyterResponse struct {
	Status          Status            `json:"status"`
	Message         string            `json:"message"`
	Driver          *CommandResult    `json:"driver"`
	Cells           []CellResult      `json:"cells"`
	ExecutorPodName *string           `json:"executor_pod_name"`
	Files           map[string]string `json:"files"`
}
